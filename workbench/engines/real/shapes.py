"""A model folder of a given shape for ``--load-format dummy``: a Llama ``config.json`` written
from the model registry (or a small shape for the CPU) beside the tiny tokenizer's files. vLLM
builds the layers from the config and fills them with random values, so an 8B-shaped engine
costs no download and no weight file; prompts go by token id, and ids past the tokenizer's
vocabulary are only ever detokenized (to nothing).
"""

from __future__ import annotations

import json
from pathlib import Path

from workbench.engines.models import MODELS
from workbench.errors import ConfigError
from workbench.outfiles import check, write_all

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# the CPU's stand-in: the tiny model's attention shape (CPU attention sizes), Llama-3.1's vocab
HOST_SHAPE = {"num_hidden_layers": 2, "hidden_size": 512, "intermediate_size": 1024,
              "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 64,
              "vocab_size": 128_256}


def shape_of(model: str) -> dict:
    """The config fields of registry model ``model`` (``host``: :data:`HOST_SHAPE`)."""
    if model == "host":
        return dict(HOST_SHAPE)
    spec = MODELS.get(model)
    if spec is None or spec.decoder is None:
        raise ConfigError(f"model {model!r}", "has no Llama decoder shape in the registry",
                          "use llama-3.1-8b (or host on the CPU)")
    d = spec.decoder
    return {"num_hidden_layers": spec.num_layers, "hidden_size": d.hidden_size,
            "intermediate_size": d.intermediate_size, "num_attention_heads": spec.q_heads,
            "num_key_value_heads": spec.kv_heads, "head_dim": spec.head_dim,
            "vocab_size": d.vocab_size, "rope_theta": d.rope_theta, "rms_norm_eps": d.rms_eps}


def write(out: str | Path, tokenizer_dir: str | Path, model: str,
          max_position: int = 8192) -> Path:
    """``out`` holding ``config.json`` of ``model``'s shape and the tokenizer of
    ``tokenizer_dir`` (its special ids become the config's)."""
    out, src = check(Path(out) / "config.json", "model folder").parent, Path(tokenizer_dir)
    files = [(out / name, (src / name).read_bytes()) for name in TOKENIZER_FILES
             if (src / name).exists()]
    tok_cfg = json.loads((src / "config.json").read_text()) if (src / "config.json").exists() \
        else {}
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 500_000.0,
           "max_position_embeddings": max_position, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16", "attention_bias": False, "mlp_bias": False,
           "bos_token_id": tok_cfg.get("bos_token_id", 1),
           "eos_token_id": tok_cfg.get("eos_token_id", 2), **shape_of(model)}
    write_all([*files, (out / "config.json", json.dumps(cfg, indent=1))], "model folder")
    return out


def kv_bytes_per_token(model: str, dtype_bytes: int = 2) -> int:
    """KV bytes of one token across every layer (K and V)."""
    s = shape_of(model)
    return 2 * s["num_hidden_layers"] * s["num_key_value_heads"] * s["head_dim"] * dtype_bytes
