"""A Llama-architecture decoder (RMSNorm, RoPE, GQA, SwiGLU) with random weights from a seed.

Nothing is downloaded: weights are drawn from a fixed-seed generator, so two engines built from the
same config compute the same function, which is all the KV-cache experiments need (they measure
memory and time, not text quality). The model is tokenizer-free: token ids in, logits out.

The forward pass takes a *packed* batch (every scheduled token of every sequence in one row, as
vLLM and SGLang do) plus an attention context (:mod:`workbench.mini.attention`) that knows where
each token's K/V goes in the paged cache and which tokens each query may see.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch
from torch import nn

from workbench.engines.models import (
    MODELS,
    DecoderShape,
    get_model,
    kv_bytes_per_token,
    llama_params,
)
from workbench.errors import ConfigError
from workbench.mini import fused


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A registry model's shape (:class:`~workbench.engines.models.ModelSpec`'s attention fields
    and :class:`~workbench.engines.models.DecoderShape`'s, under their names), flat so a test can
    override any one, and the seed of its random weights."""

    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float = 500_000.0
    rms_eps: float = 1e-5
    max_position: int = 8192
    seed: int = 0

    def __post_init__(self) -> None:
        if self.q_heads % self.kv_heads:
            raise ConfigError(f"{self.q_heads} heads over {self.kv_heads} KV heads",
                              "GQA needs whole query groups",
                              "make q_heads a multiple of kv_heads")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim={self.head_dim}", "RoPE rotates pairs",
                              "use an even head_dim")

    @property
    def decoder(self) -> DecoderShape:
        return DecoderShape(self.vocab_size, self.hidden_size, self.intermediate_size,
                            self.rope_theta, self.rms_eps, self.max_position)

    @property
    def params(self) -> int:
        return llama_params(self.num_layers, self.q_heads, self.kv_heads, self.head_dim,
                            self.decoder)

    @property
    def kv_bytes_per_token(self) -> int:
        """bf16 K and V bytes per token across every layer."""
        return kv_bytes_per_token(self.num_layers, self.kv_heads, self.head_dim)


def get_config(name: str, **overrides) -> ModelConfig:
    """The decoder of registry model ``name`` (:data:`workbench.engines.models.MODELS`), with
    ``overrides`` (``seed``, or any shape field for a test-sized variant)."""
    spec = get_model(name)
    d = spec.decoder
    if d is None or spec.mla:
        llama = ", ".join(n for n, m in MODELS.items() if m.decoder is not None)
        raise ConfigError(f"model {name!r}", "has no Llama-shaped decoder preset",
                          f"use one of {llama}")
    cfg = ModelConfig(spec.name, num_layers=spec.num_layers, q_heads=spec.q_heads,
                      kv_heads=spec.kv_heads, head_dim=spec.head_dim, **asdict(d))
    return replace(cfg, **overrides)


class RMSNorm(nn.Module):
    """Residual add + RMSNorm in one step (:func:`workbench.mini.fused.add_rms_norm`)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.kernels = "auto"

    def forward(self, h: torch.Tensor, residual: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(residual + h), residual + h)``; the sum is kept in ``residual``'s storage."""
        return fused.add_rms_norm(h, residual, self.weight, self.eps, self.kernels)


class Rotary(nn.Module):
    """Rotary position embedding, half-split convention (Llama's HF layout)."""

    def __init__(self, head_dim: int, theta: float, max_position: int):
        super().__init__()
        inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        ang = torch.arange(max_position, dtype=torch.float64)[:, None] * inv[None, :]
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)

    def at(self, positions: torch.Tensor, kernels: str) -> Rope:
        """What every layer rotates with: the tables and ``positions`` (the fused kernel reads
        the rows itself), or the rows gathered once for the whole forward (torch)."""
        if fused.use_triton(positions, kernels):
            return Rope(positions, self.cos, self.sin, kernels)
        return Rope(None, self.cos[positions], self.sin[positions], "torch")


@dataclass(slots=True)
class Rope:
    positions: torch.Tensor | None  # None: cos/sin are already one row per token
    cos: torch.Tensor
    sin: torch.Tensor
    kernels: str

    def rotate_(self, x: torch.Tensor) -> torch.Tensor:
        return fused.rotate_(x, self.positions, self.cos, self.sin, self.kernels)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.nh, self.nkv, self.hd = cfg.q_heads, cfg.kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, (self.nh + 2 * self.nkv) * self.hd, bias=False)
        self.o = nn.Linear(self.nh * self.hd, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, rope: Rope, ctx) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv(x).view(t, self.nh + 2 * self.nkv, self.hd)
        rope.rotate_(qkv[:, :self.nh + self.nkv])  # q and k heads in place, one pass
        q, k = qkv[:, :self.nh], qkv[:, self.nh:self.nh + self.nkv]
        v = qkv[:, self.nh + self.nkv:]
        out = ctx.attend(self.layer, q, k, v)  # writes k/v into the paged cache, then attends
        return self.o(out.reshape(t, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.kernels = "auto"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(fused.silu_mul(self.gate_up(x), self.kernels))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.attn = Attention(cfg, layer)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = MLP(cfg)

    def forward(self, h: torch.Tensor, residual: torch.Tensor | None, rope: Rope, ctx
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``h``: the previous block's output (the embeddings for the first), not yet added to
        ``residual``: each add rides in the next norm's kernel."""
        x, residual = self.attn_norm(h, residual)
        x, residual = self.mlp_norm(self.attn(x, rope, ctx), residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rope = Rotary(cfg.head_dim, cfg.rope_theta, cfg.max_position)
        self.kernels = "auto"

    def use_kernels(self, kernels: str) -> None:
        """``"auto"`` (fused Triton on CUDA, torch elsewhere), ``"triton"`` or ``"torch"``: for
        every norm, activation and rotation; graphs capture whichever is set when captured."""
        if kernels not in fused.KERNELS:
            raise ConfigError(f"kernels={kernels!r}", f"is not one of {fused.KERNELS}",
                              "pass 'auto', 'triton' or 'torch'")
        for m in self.modules():
            if hasattr(m, "kernels"):
                m.kernels = kernels

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx,
                logits_index: torch.Tensor | None = None) -> torch.Tensor:
        """Packed tokens -> logits (fp32) of the rows in ``logits_index`` (all rows if None)."""
        h = self.embed(input_ids)
        residual = None
        rope = self.rope.at(positions, self.kernels)
        for block in self.layers:
            h, residual = block(h, residual, rope, ctx)
        if logits_index is not None:  # the add and the norm are per row: pick rows first
            h = h[logits_index]
            residual = None if residual is None else residual[logits_index]
        x, _ = self.norm(h, residual)
        return self.lm_head(x).float()


@torch.inference_mode()
def build_model(cfg: ModelConfig, device: str | torch.device = "cpu",
                dtype: torch.dtype = torch.bfloat16) -> LlamaModel:
    """The model with weights drawn from ``cfg.seed`` directly on ``device`` (no 16 GB host copy).

    Scales keep activations O(1) through depth, so greedy decoding is not dominated by one token.
    """
    device = torch.device(device)
    with torch.device("meta"):
        model = LlamaModel(cfg)
    model = model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif name == "embed.weight":
            p.normal_(0.0, 1.0, generator=gen)
        else:
            p.normal_(0.0, p.shape[1] ** -0.5, generator=gen)
    model = model.to(dtype=dtype).eval()
    # RoPE tables stay fp32 (after the cast): bf16 angles would be off by whole turns at 8k.
    model.rope = Rotary(cfg.head_dim, cfg.rope_theta, cfg.max_position).to(device)
    return model
