"""CLIP's byte-level BPE tokenizer, built with the `tokenizers` package from a folder's
vocab.json and merges.txt (the same pipeline as transformers' CLIPTokenizer)."""
from __future__ import annotations

import json
import os

import numpy as np

from express import ModelError


class CLIPTokenizer:
    """Lower-cased, whitespace-normalized byte-level BPE with "</w>" word ends; prompts become
    `<|startoftext|> ... <|endoftext|>` padded to `model_max_length` (77).

    >>> tok = CLIPTokenizer.from_pretrained("path/to/sd/tokenizer")  # doctest: +SKIP
    >>> tok(["a photo of a cat"]).shape                                  # doctest: +SKIP
    (1, 77)
    """

    def __init__(self, vocab: dict, merges: list, model_max_length: int = 77, bos_token="<|startoftext|>",
                 eos_token="<|endoftext|>", pad_token="<|endoftext|>", unk_token="<|endoftext|>"):
        from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
        from tokenizers.models import BPE
        for name, t in (("bos", bos_token), ("eos", eos_token), ("pad", pad_token)):
            if t not in vocab:
                raise ModelError(f"CLIPTokenizer: the {name} token {t!r} is not in the vocabulary")
        self.vocab, self.model_max_length = vocab, int(model_max_length)
        self.bos_token_id, self.eos_token_id, self.pad_token_id = vocab[bos_token], vocab[eos_token], vocab[pad_token]
        tok = Tokenizer(BPE(vocab=vocab, merges=[tuple(m) for m in merges], dropout=None,
                            continuing_subword_prefix="", end_of_word_suffix="</w>", fuse_unk=False,
                            unk_token=str(unk_token)))
        tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "),
                                               normalizers.Lowercase()])
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|"
                                       r"[\p{N}]|[^\s\p{L}\p{N}]+"), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False)])
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([t for t in {bos_token, eos_token, pad_token}])
        self._tok = tok

    @classmethod
    def from_pretrained(cls, path) -> "CLIPTokenizer":
        """From a folder with vocab.json and merges.txt (or a tokenizers tokenizer.json), and
        optionally tokenizer_config.json / special_tokens_map.json for the special tokens and the
        maximum length."""
        path = os.fspath(path)
        vocab_file, merges_file = os.path.join(path, "vocab.json"), os.path.join(path, "merges.txt")
        fast = os.path.join(path, "tokenizer.json")
        if os.path.isfile(vocab_file) and os.path.isfile(merges_file):
            with open(vocab_file, encoding="utf-8") as f:
                vocab = json.load(f)
            with open(merges_file, encoding="utf-8") as f:
                lines = f.read().split("\n")
            merges = [tuple(m.split()) for m in lines if m and not m.startswith("#version") and len(m.split()) == 2]
        elif os.path.isfile(fast):  # a tokenizers file: take its BPE tables
            with open(fast, encoding="utf-8") as f:
                model = json.load(f).get("model", {})
            if model.get("type") != "BPE":
                raise ModelError(f"CLIPTokenizer: {fast!r} does not hold a BPE model")
            vocab = model["vocab"]
            merges = [tuple(m.split()) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        else:
            raise ModelError(f"CLIPTokenizer: {path!r} has no vocab.json and merges.txt (nor tokenizer.json)")
        kw = {}
        for name in ("special_tokens_map.json", "tokenizer_config.json"):
            p = os.path.join(path, name)
            if os.path.isfile(p):
                with open(p, encoding="utf-8") as f:
                    cfg = json.load(f)
                for k in ("bos_token", "eos_token", "pad_token", "unk_token", "model_max_length"):
                    v = cfg.get(k)
                    if isinstance(v, dict):
                        v = v.get("content")
                    if v is not None and not (k == "model_max_length" and v > 1e6):
                        kw[k] = v
        return cls(vocab, merges, **kw)

    def encode(self, text: str) -> list[int]:
        """BPE ids of `text`, without the start/end tokens."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        ids = [i for i in ids if i not in (self.bos_token_id, self.eos_token_id, self.pad_token_id)]
        return self._tok.decode(ids).replace("</w>", " ").strip()

    def __call__(self, prompts, max_length: int | None = None) -> np.ndarray:
        """int64 ids [batch, max_length]: start token, the prompt (truncated), end token, padding."""
        if isinstance(prompts, str):
            prompts = [prompts]
        n = max_length or self.model_max_length
        out = np.full((len(prompts), n), self.pad_token_id, np.int64)
        for i, p in enumerate(prompts):
            ids = [self.bos_token_id] + self.encode(p)[: n - 2] + [self.eos_token_id]
            out[i, :len(ids)] = ids
        return out
