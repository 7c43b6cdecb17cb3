"""Model presets: the numbers the KV geometry and the step-time model need (seed 001 §3, §9).

Sources: the models' public ``config.json`` files on Hugging Face (layers, heads, head_dim,
kv_lora_rank) and their model cards (parameter counts). MLA (DeepSeek-V2-Lite) caches one latent
buffer of ``kv_lora_rank + qk_rope_head_dim`` = 512 + 64 per token per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.geometry import KVGeometry
from workbench.errors import ConfigError


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

    @property
    def weight_bytes(self) -> int:
        return int(self.params * self.dtype_bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token across every layer and buffer."""
        bufs = 1 if self.mla else 2
        return self.num_layers * bufs * self.kv_heads * self.head_dim * self.dtype_bytes

    def geometry(self, num_blocks: int, block_size: int = 16, **kw) -> KVGeometry:
        return KVGeometry.for_model(num_layers=self.num_layers, kv_heads=self.kv_heads,
                                    head_dim=self.head_dim, mla=self.mla, block_size=block_size,
                                    num_blocks=num_blocks, dtype_bytes=self.dtype_bytes, **kw)


MODELS: dict[str, ModelSpec] = {
    # meta-llama/Llama-3.1-8B-Instruct config.json: 32 layers, 32 q heads, 8 kv heads, 128 dim.
    "llama-3.1-8b": ModelSpec("llama-3.1-8b", 32, 32, 8, 128, 8.03e9, 8.03e9),
    # Qwen/Qwen3-8B config.json: 36 layers, 32 q heads, 8 kv heads, head_dim 128; 8.2B params.
    "qwen3-8b": ModelSpec("qwen3-8b", 36, 32, 8, 128, 8.19e9, 8.19e9),
    # Qwen/Qwen3-4B (kvcached's idle-footprint bench): 36 layers, 32 q, 8 kv heads, 128 dim.
    "qwen3-4b": ModelSpec("qwen3-4b", 36, 32, 8, 128, 4.02e9, 4.02e9),
    # deepseek-ai/DeepSeek-V2-Lite: 27 layers, 16 heads, MLA kv_lora_rank 512 + rope 64,
    # 15.7B total / 2.4B active parameters (MoE).
    "deepseek-v2-lite": ModelSpec("deepseek-v2-lite", 27, 16, 1, 576, 15.7e9, 2.4e9, mla=True,
                                  attn_head_dim=192),
}


def get_model(name: str | ModelSpec) -> ModelSpec:
    if isinstance(name, ModelSpec):
        return name
    try:
        return MODELS[name.lower()]
    except KeyError:
        raise ConfigError(f"model {name!r}", "has no preset",
                          f"use one of {', '.join(MODELS)} or pass a ModelSpec") from None
