"""Tokenizer: `tokenizers` from tokenizer.json, the chat template of tokenizer_config.json rendered
with jinja2 as transformers renders it, and an incremental detokenizer that only emits text once
its UTF-8 is complete."""
from __future__ import annotations

import heapq
import json
import os
import re
from array import array
from datetime import datetime

from express import ModelError


def _token_str(t):
    if isinstance(t, dict):
        return t.get("content")
    return t


class Tokenizer:
    def __init__(self, folder: str):
        from tokenizers import Tokenizer as _Tok
        path = os.path.join(folder, "tokenizer.json")
        if not os.path.isfile(path):
            raise ModelError(f"{folder!r}: no tokenizer.json")
        cfg_path = os.path.join(folder, "tokenizer_config.json")
        config = {}
        if os.path.isfile(cfg_path):
            with open(cfg_path) as f:
                config = json.load(f)
        tmpl = config.get("chat_template")
        jinja_path = os.path.join(folder, "chat_template.jinja")
        if tmpl is None and os.path.isfile(jinja_path):
            with open(jinja_path) as f:
                tmpl = f.read()
        self._setup(_Tok.from_file(path), config, tmpl)

    @classmethod
    def from_tokenizer(cls, tok, config: dict, chat_template=None) -> "Tokenizer":
        """From a `tokenizers.Tokenizer` and tokenizer_config-style entries (e.g. read from GGUF)."""
        self = cls.__new__(cls)
        self._setup(tok, config, chat_template)
        return self

    def token_to_id(self, token: str):
        return self._tok.token_to_id(token)

    def _setup(self, tok, config, tmpl):
        self._tok, self.config = tok, config
        if isinstance(tmpl, list):  # [{"name": "default", "template": ...}, ...]
            tmpl = {t["name"]: t["template"] for t in tmpl}.get("default")
        self.chat_template = tmpl
        self.bos_token = _token_str(self.config.get("bos_token"))
        self.eos_token = _token_str(self.config.get("eos_token"))
        self.pad_token = _token_str(self.config.get("pad_token"))
        self.eos_token_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self._template = None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tokenize: bool = False, **kw):
        """Render `messages` ([{"role", "content"}]) with the model's template, as transformers does."""
        if self.chat_template is None:
            raise ModelError("this tokenizer has no chat_template (tokenizer_config.json); use generate()")
        if self._template is None:
            self._template = _compile(self.chat_template)
        special = {k: _token_str(v) for k, v in self.config.items() if k.endswith("_token")}
        text = self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     **{**special, **kw})
        return self.encode(text, add_special_tokens=False) if tokenize else text


def _compile(template: str):
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


class StreamDetokenizer:
    """Feed token ids one at a time; `add` returns the new text, holding back bytes of a character
    that is not complete yet (a multi-byte UTF-8 sequence split over tokens)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.start = 0      # tokens before `start` are emitted and stable
        self.emitted = ""   # text of ids[start:] already returned

    def add(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        text = self.tok.decode(self.ids[self.start:])
        if text.endswith("\ufffd"):
            return ""
        new = text[len(self.emitted):]
        if len(self.ids) - self.start > 8:  # keep a short window: decoding stays O(1) per token
            self.start = len(self.ids) - 4
            self.emitted = self.tok.decode(self.ids[self.start:])
        else:
            self.emitted = text
        return new

    def flush(self) -> str:
        text = self.tok.decode(self.ids[self.start:])
        new = text[len(self.emitted):]
        self.emitted = text
        return new


class _Encoding:
    __slots__ = ("ids",)

    def __init__(self, ids):
        self.ids = ids


def is_added_piece(piece: str, ty: int) -> bool:
    """Whether a GGUF vocabulary piece is matched whole in the text before BPE: control pieces
    (type 3) and user-defined ones (type 4: runs of newlines, tabs), except runs of spaces, which
    BPE builds from "\u2581" pieces."""
    return ty == 3 or (ty == 4 and "\u2581" not in piece)


class SentencePieceBPE:
    """A SentencePiece (GGUF "llama") vocabulary encoder with the interface of the `tokenizers`
    object that `tokenizer_from_gguf` builds, and the same ids: added tokens (control pieces,
    user-defined pieces without "▁") are split off first, leftmost-longest; spaces become "▁";
    then adjacent pieces merge while their concatenation is a normal or user-defined piece, best
    first by (user-defined, score, piece id, left id, right id), as the merge ranks of
    `_spm_merges`; characters outside the vocabulary fall back to <0xXX> byte pieces. It keeps
    the pieces once (a list and a dict) instead of a Rust vocabulary, reverse map and ~500k merges."""

    def __init__(self, tokens, scores, types, bos_id=None, add_space_prefix=False):
        self.pieces = tokens
        self.vocab = {t: i for i, t in enumerate(tokens)}
        self.scores = array("d", scores)
        self.types = bytes(types)
        self.bos_id, self.add_space_prefix = bos_id, add_space_prefix
        self.bytes_id = [self.vocab.get(f"<0x{b:02X}>") for b in range(256)]
        # added pieces: a set, their lengths, and a class of their first characters to find where one
        # may start (one regex of all 6384 alternatives of Gemma's vocabulary raised the load's peak
        # memory by about 9 MB to compile and kept 4 MB)
        self._added = {t for t, ty in zip(tokens, types) if is_added_piece(t, ty)}
        self._added_lens = sorted({len(t) for t in self._added}, reverse=True)
        first = "".join(sorted({t[0] for t in self._added}))
        self._added_first = re.compile(f"[{re.escape(first)}]") if first else None

    def get_vocab_size(self) -> int:
        return len(self.pieces)

    def token_to_id(self, token):
        return self.vocab.get(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> _Encoding:
        ids = [self.bos_id] if add_special_tokens and self.bos_id is not None else []
        pos = 0
        for i, j in self._added_spans(text):
            if i > pos:
                self._bpe(text[pos:i], ids)
            ids.append(self.vocab[text[i:j]])
            pos = j
        if pos < len(text):
            self._bpe(text[pos:], ids)
        return _Encoding(ids)

    def _added_spans(self, text):
        """(start, end) of each added piece in text: leftmost first, the longest at each start."""
        i = 0
        while self._added_first is not None and (m := self._added_first.search(text, i)):
            i = m.start()
            n = next((n for n in self._added_lens if text[i:i + n] in self._added), 0)
            if n:
                yield i, i + n
            i += n or 1

    def _rank(self, a, b):
        """Merge rank of adjacent pieces a, b (smaller first), None where they do not merge."""
        p = self.vocab.get(self.pieces[a] + self.pieces[b])
        if p is None or self.types[p] not in (1, 4):
            return None
        return (self.types[p] != 4, -self.scores[p], p, a, b)

    def _bpe(self, text, out):
        text = text.replace(" ", "\u2581")
        if self.add_space_prefix:
            text = "\u2581" + text
        sym = []  # initial symbols: characters, or byte pieces (which never merge) for unknown ones
        for ch in text:
            i = self.vocab.get(ch)
            if i is not None:
                sym.append(i)
            else:
                sym.extend(-1 - self.bytes_id[b] if self.bytes_id[b] is not None else -1 - self.vocab.get("<unk>", 0)
                           for b in ch.encode("utf-8"))
        n = len(sym)
        nxt, prv = list(range(1, n + 1)), list(range(-1, n - 1))
        heap = []
        for k in range(n - 1):
            if sym[k] >= 0 and sym[k + 1] >= 0:
                r = self._rank(sym[k], sym[k + 1])
                if r is not None:
                    heap.append((r, k, sym[k], sym[k + 1]))
        heapq.heapify(heap)
        while heap:
            r, k, a, b = heapq.heappop(heap)
            j = nxt[k]
            if sym[k] != a or j >= n or sym[j] != b:
                continue  # stale: one side merged already
            sym[k] = self.vocab[self.pieces[a] + self.pieces[b]]
            sym[j] = None
            nxt[k] = nxt[j]
            if nxt[k] < n:
                prv[nxt[k]] = k
            p, q = prv[k], nxt[k]
            if p >= 0 and sym[p] is not None and sym[p] >= 0:
                r2 = self._rank(sym[p], sym[k])
                if r2 is not None:
                    heapq.heappush(heap, (r2, p, sym[p], sym[k]))
            if q < n and sym[q] >= 0:
                r2 = self._rank(sym[k], sym[q])
                if r2 is not None:
                    heapq.heappush(heap, (r2, k, sym[k], sym[q]))
        out.extend(s if s >= 0 else -1 - s for s in sym if s is not None)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        parts, raw = [], bytearray()
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.pieces):
                raise ModelError(f"token id {i} is out of range (vocabulary of {len(self.pieces)})")
            ty = self.types[i]
            if ty == 6:
                raw.append(int(self.pieces[i][3:5], 16))
                continue
            if raw:
                parts.append(_bytes_text(raw))
                raw = bytearray()
            if ty == 3 and skip_special_tokens:
                continue
            parts.append(self.pieces[i].replace("\u2581", " "))
        if raw:
            parts.append(_bytes_text(raw))
        text = "".join(parts)
        if self.add_space_prefix and text.startswith(" "):
            text = text[1:]
        return text


def _bytes_text(raw):
    # as tokenizers' ByteFallback: a run of byte pieces is its UTF-8 text, or one U+FFFD per byte
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * len(raw)
