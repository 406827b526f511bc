#!/usr/bin/env python
"""Train the embedded tiny target: a byte-level BPE tokenizer and a small Qwen3 code model.

Data: the ``Lib/*.py`` sources of the Python running this script, in sorted file order.
Every 8th file (index % 8 == 5) is held out: it never reaches the tokenizer or the model,
and the evaluation prompts (``heldout_prompts.jsonl``) are cut from it.

    python scripts/train_tiny_target.py --out build/tiny/target --work build/tiny

writes OUT (Hugging Face checkpoint, bf16 safetensors, tokenizer with ``<|mask|>``),
WORK/train_files/ (the training split, the drafter's --data), WORK/heldout_prompts.jsonl.
Deterministic up to torch's CPU kernels: same Python, same seed, same model.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sysconfig
import time
from pathlib import Path

import torch

EOS, MASK = "<|endoftext|>", "<|mask|>"


def stdlib_split(every: int = 8, offset: int = 5) -> tuple[list[Path], list[Path]]:
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"), key=lambda p: p.name)
    if not files:
        raise SystemExit("no Lib/*.py found for this Python")
    train = [f for i, f in enumerate(files) if i % every != offset]
    held = [f for i, f in enumerate(files) if i % every == offset]
    return train, held


def read(p: Path) -> str:
    return p.read_text(encoding="utf-8", errors="replace")


def train_tokenizer(texts: list[str], vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=2,
        special_tokens=[EOS, MASK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=EOS,
        mask_token=MASK,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )


def heldout_prompts(files: list[Path], n: int, context_lines: int = 12) -> list[dict]:
    """One prompt per held-out file: the lines before a top-level or method ``def``, that line included."""
    out = []
    for f in files:
        lines = read(f).splitlines()
        for i in range(30, len(lines)):
            s = lines[i].lstrip()
            if s.startswith("def ") and lines[i].rstrip().endswith(":"):
                text = "\n".join(lines[max(0, i - context_lines) : i + 1]) + "\n"
                out.append({"prompt": text, "source": f"Lib/{f.name}:{i + 1}"})
                break
        if len(out) == n:
            break
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--intermediate", type=int, default=384)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=700)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(args.seed)
    train_files, held_files = stdlib_split()
    texts = [read(f) for f in train_files]
    print(f"stdlib: {len(train_files)} training files, {len(held_files)} held out", flush=True)

    t0 = time.time()
    tok = train_tokenizer(texts, args.vocab)
    ids: list[int] = []
    for t in texts:
        ids += tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    data = torch.tensor(ids, dtype=torch.long)
    held = torch.tensor(
        [i for f in held_files for i in tok(read(f), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]]
    )
    print(
        f"tokenizer: {len(tok)} tokens, {len(data)} training tokens, {len(held)} held-out ({time.time() - t0:.0f}s)",
        flush=True,
    )

    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id,
        bos_token_id=None,
    )
    model = Qwen3ForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters", flush=True)
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    warm = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps))))
    )
    g = torch.Generator().manual_seed(args.seed)
    L = args.seq_len
    model.train()
    t0 = time.time()
    for step in range(1, args.steps + 1):
        starts = torch.randint(0, len(data) - L - 1, (args.batch,), generator=g)
        x = torch.stack([data[s : s + L + 1] for s in starts.tolist()])
        loss = model(input_ids=x[:, :-1], labels=x[:, :-1]).loss
        # transformers shifts labels itself: labels == inputs gives next-token loss.
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 10 == 0 or step == args.steps:
            el = time.time() - t0
            print(
                f"step {step}/{args.steps} loss {loss.item():.3f} lr {sched.get_last_lr()[0]:.2e} "
                f"{step * args.batch * L / el:.0f} tok/s {el:.0f}s",
                flush=True,
            )
    model.eval()
    with torch.no_grad():
        chunks = held[: (len(held) // L) * L].view(-1, L)[:32]
        eval_loss = model(input_ids=chunks, labels=chunks).loss.item()
    print(f"held-out loss {eval_loss:.3f} (perplexity {math.exp(eval_loss):.1f})", flush=True)

    # ---- write: temp dir, then rename --------------------------------------------------
    tmp = args.out.with_name(args.out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.config.architectures = ["Qwen3ForCausalLM"]
    model.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
    GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id, do_sample=False).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "training.json").write_text(
        json.dumps(
            {
                "data": "Lib/*.py of Python " + sysconfig.get_python_version() + ", sorted; index % 8 == 5 held out",
                "train_files": len(train_files),
                "heldout_files": [f.name for f in held_files],
                "train_tokens": len(data),
                "steps": args.steps,
                "batch": args.batch,
                "seq_len": L,
                "lr": args.lr,
                "seed": args.seed,
                "params": n_params,
                "heldout_loss": round(eval_loss, 4),
                "seconds": round(time.time() - t0, 1),
            },
            indent=2,
        )
        + "\n"
    )
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(args.out)

    args.work.mkdir(parents=True, exist_ok=True)
    tf = args.work / "train_files"
    shutil.rmtree(tf, ignore_errors=True)
    tf.mkdir()
    for f in train_files:
        shutil.copyfile(f, tf / (f.name + ".txt"))
    with open(args.work / "heldout_prompts.jsonl", "w") as fh:
        for p in heldout_prompts(held_files, args.prompts):
            fh.write(json.dumps(p) + "\n")
    print(f"wrote {args.out} and {args.work}", flush=True)


if __name__ == "__main__":
    main()
