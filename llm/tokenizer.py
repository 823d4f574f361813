"""Tokenizer: `tokenizers` from tokenizer.json, the chat template of tokenizer_config.json rendered
with jinja2 as transformers renders it, and an incremental detokenizer that only emits text once
its UTF-8 is complete."""
from __future__ import annotations

import json
import os
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
