"""config.json -> `ModelConfig`: one dataclass for every family, with the per-family switches the
shared decoder reads (biases, q/k norm, extra GLM norms, rotary style and fraction)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from express import ModelError

# architecture -> family defaults that config.json does not spell out
FAMILIES = {
    "LlamaForCausalLM": dict(family="llama"),
    "MistralForCausalLM": dict(family="mistral"),
    "Qwen2ForCausalLM": dict(family="qwen2", qkv_bias=True),
    "Qwen3ForCausalLM": dict(family="qwen3", qk_norm=True),
    "Glm4ForCausalLM": dict(family="glm4", qkv_bias=True, fused_gate_up=True, sandwich_norm=True,
                            rope_interleaved=True, partial_rotary_factor=0.5),
    "Gemma3ForCausalLM": dict(family="gemma3", qk_norm=True, sandwich_norm=True, norm_offset=1.0),
}


@dataclass
class ModelConfig:
    architecture: str
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False          # bias on q/k/v projections
    o_bias: bool = False            # bias on the output projection
    mlp_bias: bool = False
    qk_norm: bool = False           # Qwen3: RMSNorm over head_dim on q and k
    sandwich_norm: bool = False     # GLM-4: norms after attention and after the MLP too
    fused_gate_up: bool = False     # GLM-4: one gate_up_proj
    hidden_act: str = "silu"
    rope_theta: float = 10000.0
    rope_scaling: dict = field(default_factory=dict)
    rope_interleaved: bool = False  # GLM-4 rotates (even, odd) pairs, the others the two halves
    partial_rotary_factor: float = 1.0
    sliding_window: int | None = None
    layer_sliding: tuple = ()       # per layer: does the sliding window apply? (empty: every layer)
    rope_theta_local: float | None = None  # Gemma 3: the rope base of sliding-window layers
    attn_scale: float | None = None  # attention scale if not head_dim ** -0.5 (Gemma's query_pre_attn_scalar)
    embed_scale: float = 1.0        # Gemma multiplies embeddings by sqrt(hidden_size)
    norm_offset: float = 0.0        # Gemma's RMSNorm scales by (offset + weight); folded in at load
    final_logit_softcap: float | None = None  # logits = cap * tanh(logits / cap)
    bos_token_id: int | None = None
    eos_token_ids: tuple = ()

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_dict(cls, cfg: dict, where: str = "config.json") -> "ModelConfig":
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else None
        if arch not in FAMILIES:
            raise ModelError(f"{where}: architecture {arch!r} is not supported (supported: "
                             f"{', '.join(sorted(FAMILIES))})")
        fam = dict(FAMILIES[arch])
        try:
            heads = cfg["num_attention_heads"]
            rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
            if "type" in rope and "rope_type" not in rope:
                rope["rope_type"] = rope.pop("type")
            theta = rope.pop("rope_theta", cfg.get("rope_theta", 10000.0))
            prf = fam.pop("partial_rotary_factor", 1.0)
            prf = rope.pop("partial_rotary_factor", cfg.get("partial_rotary_factor", prf))
            bias = cfg.get("attention_bias")
            if fam["family"] in ("llama", "mistral", "qwen3") and bias:
                fam["qkv_bias"] = fam["o_bias"] = True
            if fam["family"] == "glm4" and bias is not None:
                fam["qkv_bias"] = bool(bias)
            eos = cfg.get("eos_token_id")
            eos = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
            use_sw = cfg.get("use_sliding_window", fam["family"] in ("mistral", "gemma3"))
            if fam["family"] == "gemma3":
                fam.update(_gemma3(cfg, heads))
                theta = fam.pop("rope_theta")
                rope = fam.pop("rope_scaling")
            return cls(
                architecture=arch, vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                intermediate_size=cfg["intermediate_size"], num_layers=cfg["num_hidden_layers"],
                num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads,
                head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
                max_position_embeddings=cfg.get("max_position_embeddings", 4096),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                mlp_bias=bool(cfg.get("mlp_bias", False)),
                hidden_act=cfg.get("hidden_act") or cfg.get("hidden_activation") or "silu",
                rope_theta=float(theta), rope_scaling=rope, partial_rotary_factor=float(prf),
                sliding_window=cfg.get("sliding_window") if use_sw else None,
                bos_token_id=cfg.get("bos_token_id"), eos_token_ids=eos, **fam)
        except KeyError as e:
            raise ModelError(f"{where}: missing field {e.args[0]!r} for {arch}") from None


def _gemma3(cfg: dict, heads: int) -> dict:
    """Gemma 3's switches: sliding-window layers with their own rope base, scaled embeddings,
    (1 + w) norms, the attention scale from query_pre_attn_scalar, optional logit soft-capping."""
    if cfg.get("attn_logit_softcapping") is not None:
        raise ModelError("Gemma: attention logit soft-capping (Gemma 2) is not supported")
    n = cfg["num_hidden_layers"]
    types = cfg.get("layer_types") or [
        "sliding_attention" if (i + 1) % cfg.get("sliding_window_pattern", 6) else "full_attention" for i in range(n)]
    rp = cfg.get("rope_parameters") or {}
    full = dict(rp.get("full_attention") or cfg.get("rope_scaling") or {})
    local = rp.get("sliding_attention") or {}
    theta = full.pop("rope_theta", cfg.get("rope_theta", 1_000_000.0))
    if "type" in full and "rope_type" not in full:
        full["rope_type"] = full.pop("type")
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return dict(layer_sliding=tuple(t == "sliding_attention" for t in types), rope_theta=float(theta),
                rope_scaling=full, rope_theta_local=float(local.get("rope_theta", cfg.get("rope_local_base_freq", 10_000.0))),
                attn_scale=float(cfg.get("query_pre_attn_scalar") or head_dim) ** -0.5,
                embed_scale=float(np.float32(cfg["hidden_size"] ** 0.5)),
                final_logit_softcap=cfg.get("final_logit_softcapping"))


def read_config(folder) -> ModelConfig:
    path = os.path.join(os.fspath(folder), "config.json")
    if not os.path.isfile(path):
        raise ModelError(f"{folder!r} is not a model folder: no config.json")
    with open(path) as f:
        return ModelConfig.from_dict(json.load(f), path)
