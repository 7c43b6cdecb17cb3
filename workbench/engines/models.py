"""Model presets, one registry with one name per model (seed 001 §3, §9): the numbers the KV
geometry and the step-time model need, and for Llama-shaped models the decoder shape the mini
engine builds (``workbench.mini.model.get_config`` reads it, under the same field names, and its
sizes come from :func:`kv_bytes_per_token` and :func:`llama_params`; torch is not imported here).

Sources: the models' public ``config.json`` files on Hugging Face (layers, heads, head_dim,
kv_lora_rank) and their model cards (parameter counts). MLA (DeepSeek-V2-Lite) caches one latent
buffer of ``kv_lora_rank + qk_rope_head_dim`` = 512 + 64 per token per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.geometry import KVGeometry
from workbench.errors import ConfigError


@dataclass(frozen=True, slots=True)
class DecoderShape:
    """What a Llama-architecture decoder needs beyond the attention shape (the mini engine)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    rope_theta: float = 500_000.0
    rms_eps: float = 1e-5
    max_position: int = 8192


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    num_layers: int
    q_heads: int
    kv_heads: int  # 1 for MLA (one latent "head")
    head_dim: int  # latent width for MLA
    params: float  # total parameters (weights held in memory)
    active_params: float  # parameters touched per token (MoE: fewer than ``params``)
    mla: bool = False
    attn_head_dim: int = 128  # per-head width used by attention FLOPs
    dtype_bytes: int = 2
    decoder: DecoderShape | None = None  # None: no Llama-shaped decoder (the mini engine refuses)

    @property
    def weight_bytes(self) -> int:
        return int(self.params * self.dtype_bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token across every layer and buffer."""
        return kv_bytes_per_token(self.num_layers, self.kv_heads, self.head_dim,
                                  dtype_bytes=self.dtype_bytes, mla=self.mla)

    def geometry(self, num_blocks: int, block_size: int = 16, **kw) -> KVGeometry:
        return KVGeometry.for_model(num_layers=self.num_layers, kv_heads=self.kv_heads,
                                    head_dim=self.head_dim, mla=self.mla, block_size=block_size,
                                    num_blocks=num_blocks, dtype_bytes=self.dtype_bytes, **kw)


def kv_bytes_per_token(num_layers: int, kv_heads: int, head_dim: int, *, dtype_bytes: int = 2,
                       mla: bool = False) -> int:
    """KV bytes of one token across every layer: K and V, or MLA's one latent buffer."""
    return num_layers * (1 if mla else 2) * kv_heads * head_dim * dtype_bytes


def llama_params(num_layers: int, q_heads: int, kv_heads: int, head_dim: int,
                 d: DecoderShape) -> int:
    """Parameters of a Llama decoder: attention, SwiGLU MLP, two norms per layer, embedding and
    head (untied), final norm."""
    h, i, v = d.hidden_size, d.intermediate_size, d.vocab_size
    attn = h * head_dim * (q_heads * 2 + kv_heads * 2)
    return num_layers * (attn + 3 * h * i + 2 * h) + 2 * v * h + h


# A two-layer toy for tests and CPU runs of the mini engine (random weights).
_TINY = DecoderShape(vocab_size=512, hidden_size=128, intermediate_size=256, max_position=4096)

MODELS: dict[str, ModelSpec] = {
    # meta-llama/Llama-3.1-8B-Instruct config.json: 32 layers, 32 q heads, 8 kv heads, 128 dim;
    # hidden 4096, MLP 14336, vocab 128256, rope_theta 500000 (RoPE scaling left out: contexts
    # here stay < 8k).
    "llama-3.1-8b": ModelSpec("llama-3.1-8b", 32, 32, 8, 128, 8.03e9, 8.03e9,
                              decoder=DecoderShape(128_256, 4096, 14_336)),
    # Qwen/Qwen3-8B config.json: 36 layers, 32 q heads, 8 kv heads, head_dim 128; 8.2B params.
    "qwen3-8b": ModelSpec("qwen3-8b", 36, 32, 8, 128, 8.19e9, 8.19e9),
    # Qwen/Qwen3-4B (kvcached's idle-footprint bench): 36 layers, 32 q, 8 kv heads, 128 dim.
    "qwen3-4b": ModelSpec("qwen3-4b", 36, 32, 8, 128, 4.02e9, 4.02e9),
    # deepseek-ai/DeepSeek-V2-Lite: 27 layers, 16 heads, MLA kv_lora_rank 512 + rope 64,
    # 15.7B total / 2.4B active parameters (MoE).
    "deepseek-v2-lite": ModelSpec("deepseek-v2-lite", 27, 16, 1, 576, 15.7e9, 2.4e9, mla=True,
                                  attn_head_dim=192),
    "tiny": ModelSpec("tiny", 2, 4, 2, 32, llama_params(2, 4, 2, 32, _TINY),
                      llama_params(2, 4, 2, 32, _TINY), decoder=_TINY),
}

# Old names still accepted (``workbench serve --model llama3-8b``, results written before the
# registry was one); new code uses the registry's names.
ALIASES: dict[str, str] = {"llama3-8b": "llama-3.1-8b"}


def mini_models() -> tuple[str, ...]:
    """The registry's models the mini engine can build (a Llama-shaped decoder, not MLA)."""
    return tuple(n for n, m in MODELS.items() if m.decoder is not None and not m.mla)


def get_model(name: str | ModelSpec) -> ModelSpec:
    if isinstance(name, ModelSpec):
        return name
    key = name.lower()
    try:
        return MODELS[ALIASES.get(key, key)]
    except KeyError:
        raise ConfigError(f"model {name!r}", "has no preset",
                          f"use one of {', '.join(MODELS)} or pass a ModelSpec") from None
