"""Write a random-weight target + drafter pair for step-cost benchmarks (no download).

    python bench/random_pair.py OUT_DIR [--hidden 512 --layers 8 --draft-layers 1 --vocab 8192 --block 8]
    dflash-trt bench --target OUT_DIR/target --drafter OUT_DIR/drafter --prompts OUT_DIR/prompts.txt -n 64

Random weights give τ ≈ 1 (nothing is accepted), which is what this measures: the cost
of one DFlash step (draft + verify) against one target forward over the same block, and
where the time goes (bench's "step" section).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--draft-layers", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    from dflash_trt.model.config import DrafterConfig
    from dflash_trt.model.drafter import Drafter

    torch.manual_seed(a.seed)
    heads = max(1, a.hidden // 64)
    cfg = Qwen3Config(
        vocab_size=a.vocab,
        hidden_size=a.hidden,
        intermediate_size=3 * a.hidden,
        num_hidden_layers=a.layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 4),
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        rope_theta=1_000_000.0,
    )
    target = Qwen3ForCausalLM(cfg).eval()
    target.save_pretrained(a.out / "target", safe_serialization=True)
    # Byte-level-ish tokenizer: one token per character, ids within the vocabulary.
    table = {"<pad>": 0, "<s>": 1, "</s>": 2, **{chr(i): i + 3 for i in range(32, 127)}, "<mask>": a.vocab - 1}
    tok = Tokenizer(models.WordLevel(table, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", mask_token="<mask>"
    ).save_pretrained(a.out / "target")
    n = a.layers
    dcfg = DrafterConfig(
        hidden_size=a.hidden,
        intermediate_size=3 * a.hidden,
        num_hidden_layers=a.draft_layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 4),
        head_dim=64,
        vocab_size=a.vocab,
        block_size=a.block,
        mask_token_id=a.vocab - 1,
        target_layer_ids=sorted({1, n // 2, n - 2}),
        num_target_layers=n,
        max_position_embeddings=4096,
        rope_theta=1_000_000.0,
    )
    Drafter(dcfg).save(a.out / "drafter")
    prompts = ["def main(argv):", "import os, sys", "class Node:", "for i in range(10):"]
    (a.out / "prompts.txt").write_text("\n".join(prompts) + "\n")
    print(json.dumps({"out": str(a.out), "target_layers": n, "hidden": a.hidden, "draft_layers": a.draft_layers}))


if __name__ == "__main__":
    main()
