"""`LLM`: a model, its tokenizer and KV cache; prefill in chunks and decode through one compiled
step (`ex.compile`, one plan per (tokens, cache bucket)); generate / chat / stream."""
from __future__ import annotations

import numpy as np

import express as ex
from express import ExpressError, OutOfRangeError

from .kv_cache import KVCache
from .model import CausalLM
from .sampler import Sampler, SamplerConfig
from .tokenizer import StreamDetokenizer

BUCKET = 256  # the cache is attended over the first multiple of BUCKET slots that holds the tokens


class LLM:
    """A loaded language model (see `llm.load`).

    `forward(ids)` returns logits [tokens, vocab]; `generate(prompt, ...)` returns text (or, with
    `stream=True`, an iterator of text pieces); `chat(messages, ...)` renders the chat template
    first. The KV cache keeps the tokens of the last call, so a prompt that extends them (a chat
    history) only runs its new part; `reset()` empties it."""

    def __init__(self, model: CausalLM, tokenizer=None, generation_config: dict | None = None,
                 max_context: int | None = None, prefill_chunk: int = 128, embed=None):
        self.model, self.tokenizer = model, tokenizer
        self.config = model.config
        self.generation_config = dict(generation_config or {})
        n = max_context or min(self.config.max_position_embeddings, 4096)
        self.max_context = int(n)
        self.prefill_chunk = int(prefill_chunk)
        self.cache = KVCache(self.config, self.max_context)
        self._embed = embed
        self._step_all = ex.compile(self._graph_all)
        self._step_last = ex.compile(self._graph_last)
        self._decode_steps = {}  # cache length L -> the one-token plan (self._step_last's) for it
        self._token = np.zeros(1, np.int64)
        eos = set(self.config.eos_token_ids)
        g = self.generation_config.get("eos_token_id")
        eos |= set(g if isinstance(g, list) else [] if g is None else [g])
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        self.eos_token_ids = eos
        self.lora = None  # the active adapter
        self._loras = set()

    # ---- the compiled step ----
    def _graph_all(self, h, pos, L):
        return self.model.step(h, pos, self.cache.layers, L)

    def _graph_last(self, h, pos, last, L):
        return self.model.step(h, pos, self.cache.layers, L, last)

    def _bucket(self, n):
        return min(self.max_context, -(-n // BUCKET) * BUCKET)

    def invalidate(self):
        """Drop the compiled plans (after the weights change, e.g. a LoRA switch)."""
        self._step_all.cache.clear()
        self._step_last.cache.clear()
        self._decode_steps.clear()

    def _check_room(self, n):
        if self.cache.pos + n > self.max_context:
            raise OutOfRangeError(f"{self.cache.pos + n} tokens do not fit the context of {self.max_context} tokens "
                                  f"(load with a larger max_context, or shorten the prompt)")

    def _decode(self, tok: int) -> np.ndarray:
        """Append one token; its logits [vocab] are the decode plan's own output buffer, valid
        until the next step.  Generation samples from them at once, so a step is the lookup, two
        scalar writes and the plan: after a step has streamed the weights through the caches,
        every Python line runs cold (the argument checks and copies of a compiled call cost
        0.3 - 0.5 ms a token on a 0.5B model)."""
        self._check_room(1)
        pos = self.cache.pos
        L = self._bucket(pos + 1)
        step = self._decode_steps.get(L)
        if step is None:
            h = np.zeros((1, self.config.hidden_size), np.float32)
            step = self._decode_steps[L] = self._step_last.prepare(h, np.array(pos, np.int64), np.zeros(1, np.int64), L)
        h, p, last = step.input_arrays
        self._token[0] = tok
        h[...] = self._embed(self._token)
        p[...] = pos
        last[...] = 0
        logits = step.run()[0]
        self.cache.tokens.append(int(tok))
        return logits[0]

    def _run(self, ids, last_only=True) -> np.ndarray:
        """Append `ids` to the cache; logits of the last token ([1, vocab]) or of all of them."""
        self._check_room(len(ids))
        if len(ids) == 1 and last_only:
            return self._decode(ids[0])[None].copy()
        pos0 = self.cache.pos
        outs = []
        for i in range(0, len(ids), self.prefill_chunk):
            part = list(ids[i:i + self.prefill_chunk])
            n, pos = len(part), pos0 + i
            T = min(1 << (n - 1).bit_length(), self.prefill_chunk)  # pad to a power of two: few plans
            if pos + T > self.max_context:
                T = n
            h = np.zeros((T, self.config.hidden_size), np.float32)
            h[:n] = self._embed(np.asarray(part, np.int64))
            p, L = np.array(pos, np.int64), self._bucket(pos + T)
            lg = self._step_last(h, p, np.array([n - 1], np.int64), L) if last_only else self._step_all(h, p, L)
            self.cache.tokens.extend(part)
            outs.append(lg.numpy() if last_only else lg.numpy()[:n])
        return outs[-1] if last_only else np.concatenate(outs)

    # ---- LoRA ----
    def add_lora(self, name: str, peft_dir):
        """Attach a PEFT LoRA adapter under `name` (the base weights stay as they are)."""
        from . import lora
        lora.add(self, name, peft_dir)

    def set_lora(self, name):
        """Switch to adapter `name`, or to the base model with None (the cache is reset)."""
        from . import lora
        lora.select(self, name)

    # ---- public API ----
    def reset(self):
        """Forget the cached tokens (the next call starts from position 0)."""
        self.cache.reset()

    def forward(self, input_ids) -> np.ndarray:
        """Logits [tokens, vocab] (float32) of `input_ids` from position 0 (the cache is reset).

        >>> import llm  # doctest: +SKIP
        >>> llm.load("Qwen2.5-0.5B").forward([1, 2, 3]).shape  # doctest: +SKIP
        (3, 151936)
        """
        ids = [int(i) for i in np.asarray(input_ids).reshape(-1)]
        if not ids:
            raise ExpressError("forward: input_ids is empty")
        self.reset()
        return self._run(ids, last_only=False)

    def _prefill(self, ids):
        n = self.cache.common_prefix(ids)
        n = min(n, len(ids) - 1)  # always run at least the last token, for its logits
        self.cache.tokens = self.cache.tokens[:n]
        return self._run(ids[n:])[0]

    def generate_ids(self, prompt_ids, max_new_tokens=128, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0,
                     repetition_penalty=1.0, seed=None, stop_on_eos=True):
        """Yield generated token ids one by one (stops at EOS, max_new_tokens or a full context)."""
        ids = [int(i) for i in prompt_ids]
        if not ids:
            raise ExpressError("generate: the prompt is empty")
        if len(ids) >= self.max_context:
            raise OutOfRangeError(f"generate: the prompt has {len(ids)} tokens, the context holds "
                                  f"{self.max_context} (load with a larger max_context, or shorten the prompt)")
        sampler = Sampler(SamplerConfig(temperature, top_k, top_p, min_p, repetition_penalty, seed))
        logits = self._prefill(ids)
        history = list(ids)
        for i in range(max_new_tokens):
            tok = sampler.sample(logits, history)
            if stop_on_eos and tok in self.eos_token_ids:
                return
            yield tok
            history.append(tok)
            if i + 1 == max_new_tokens or self.cache.pos >= self.max_context:
                return
            logits = self._decode(tok)

    def _encode(self, prompt):
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ExpressError("generate: this model folder has no tokenizer.json; pass token ids")
            return self.tokenizer.encode(prompt)
        return [int(i) for i in prompt]

    def generate(self, prompt, max_new_tokens=128, temperature=0.0, top_k=0, top_p=1.0, repetition_penalty=1.0,
                 seed=None, stream=False, min_p=0.0):
        """Continue `prompt` (text or token ids): the generated text, or with `stream=True` an
        iterator of text pieces (each a whole number of UTF-8 characters)."""
        gen = self.generate_ids(self._encode(prompt), max_new_tokens, temperature, top_k, top_p, min_p,
                                repetition_penalty, seed)
        if stream:
            return self._stream(gen)
        return self.tokenizer.decode(list(gen))

    def _stream(self, gen):
        detok = StreamDetokenizer(self.tokenizer)
        for tok in gen:
            piece = detok.add(tok)
            if piece:
                yield piece
        tail = detok.flush()
        if tail:
            yield tail

    def chat(self, messages, max_new_tokens=256, stream=False, **sampling):
        """Reply to `messages` ([{"role": "user", "content": ...}, ...]) with the chat template."""
        if self.tokenizer is None:
            raise ExpressError("chat: this model folder has no tokenizer")
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return self.generate(ids, max_new_tokens, stream=stream, **sampling)
