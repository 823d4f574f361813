"""Next-token sampling over one row of logits (NumPy): repetition penalty, temperature, top-k,
top-p, min-p; greedy when temperature is 0."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from express import ExpressError


@dataclass
class SamplerConfig:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def check(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1 or not 0 <= self.min_p < 1 or self.top_k < 0 \
                or self.repetition_penalty <= 0:
            raise ExpressError(f"sampling: bad parameters {self} (need temperature >= 0, 0 < top_p <= 1, "
                               f"0 <= min_p < 1, top_k >= 0, repetition_penalty > 0)")


class Sampler:
    """>>> import numpy as np
    >>> Sampler(SamplerConfig()).sample(np.array([0.1, 3.0, -1.0], np.float32), [])
    1
    """

    def __init__(self, cfg: SamplerConfig):
        cfg.check()
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)

    def probs(self, logits: np.ndarray, history) -> np.ndarray:
        """The distribution sampled from (float64), after the penalty and the filters in
        transformers' order: repetition penalty, temperature, top-k, top-p, min-p."""
        c = self.cfg
        x = np.asarray(logits, np.float64).copy()
        if c.repetition_penalty != 1.0 and len(history):
            seen = np.unique(np.asarray(history, np.int64))
            s = x[seen]
            x[seen] = np.where(s > 0, s / c.repetition_penalty, s * c.repetition_penalty)
        if c.temperature == 0:
            p = np.zeros_like(x)
            p[np.argmax(x)] = 1
            return p
        x = x / c.temperature
        if c.top_k and c.top_k < x.size:
            kth = np.partition(x, -c.top_k)[-c.top_k]
            x[x < kth] = -np.inf
        p = np.exp(x - x.max())
        p /= p.sum()
        if c.top_p < 1.0:
            order = np.argsort(-p, kind="stable")
            cum = np.cumsum(p[order])
            cut = int(np.searchsorted(cum, c.top_p)) + 1  # the smallest prefix holding top_p of the mass
            drop = np.ones_like(p, dtype=bool)
            drop[order[:cut]] = False
            p[drop] = 0
            p /= p.sum()
        if c.min_p > 0:
            p[p < c.min_p * p.max()] = 0
            p /= p.sum()
        return p

    def sample(self, logits: np.ndarray, history) -> int:
        if self.cfg.temperature == 0 and self.cfg.repetition_penalty == 1.0:
            return int(np.argmax(logits))
        p = self.probs(logits, history)
        if self.cfg.temperature == 0:
            return int(np.argmax(p))
        return int(self.rng.choice(p.size, p=p))
