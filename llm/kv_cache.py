"""The KV cache: per layer a key and a value buffer (kv_heads, max_context, head_dim), allocated
once and written in place by `ex.slice_update` at the runtime position; `tokens` mirrors what the
cache holds, so a new prompt that extends it only runs its new suffix."""
from __future__ import annotations

import numpy as np

import express as ex

from .config import ModelConfig


class KVCache:
    def __init__(self, c: ModelConfig, max_context: int):
        self.max_context = int(max_context)
        shape = (c.num_kv_heads, self.max_context, c.head_dim)
        self.layers = []
        for _ in range(c.num_layers):  # separate NumPy buffers (pages are touched only when written)
            self.layers.append((ex.asarray(np.zeros(shape, np.float32)), ex.asarray(np.zeros(shape, np.float32))))
        self.tokens: list[int] = []

    @property
    def pos(self) -> int:
        return len(self.tokens)

    def reset(self):
        self.tokens = []

    def common_prefix(self, ids) -> int:
        n = 0
        for a, b in zip(self.tokens, ids):
            if a != b:
                break
            n += 1
        return n

    def nbytes(self) -> int:
        return sum(k.numpy().nbytes + v.numpy().nbytes for k, v in self.layers)
