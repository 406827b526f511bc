"""τ of dflash-trt's DFlash2 reference runtime against the authors' ``dflash`` package, same weights.

The pair: the embedded tiny target and a DFlash2 drafter built on the embedded (trained) DFlash
drafter's backbone, with its convolutions and candidate selector perturbed away from the
identity (so both matter), layer 0 sliding (window 48) and ``is_causal: false`` as the published
DFlash2 drafters are. Written in the published form (``DFlash2DraftModel``) and read by both.

Run ``prepare`` and ``ours`` with dflash-trt installed, ``authors`` in a separate venv holding
the authors' package (``pip install dflash`` + torch + transformers; it never imports
dflash-trt), then ``compare``. Greedy, float32, batch 1, CPU::

    python bench/dflash2_authors.py prepare OUT
    python bench/dflash2_authors.py ours OUT
    /path/to/dflash-venv/bin/python bench/dflash2_authors.py authors OUT
    python bench/dflash2_authors.py compare OUT      # exit 1 unless tokens and τ agree

The authors' loop (``dflash.model.dflash_generate``) shrinks its last block to the tokens left,
which changes the last draft (the block attends non-causally to itself); rounds are compared up
to that point, and τ over all rounds is reported for both.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "dflash_trt" / "assets" / "tiny"
DFLASH2 = dict(conv_kernel_size=2, conv_group_size=16, selector_rank=32, selector_top_k=8)


def prepare(out: Path, n_prompts: int, prompt_tokens: int) -> None:
    import torch

    sys.path.insert(0, str(ROOT))
    from dflash_trt.model import DFlash2Drafter, Drafter
    from dflash_trt.runtime import load_tokenizer

    v1 = Drafter.load(TINY / "drafter", dtype=torch.float32)
    cfg = v1.cfg.model_copy(
        update={
            **DFLASH2,
            "causal": False,
            "sliding_window": 48,
            "dtype": "float32",
            "layer_types": ["sliding_attention", "full_attention"],
        }
    )
    d = DFlash2Drafter(cfg)
    d.load_state_dict(v1.state_dict(), strict=False)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in d.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                conv.base_kernel[:, 1].normal_(0.0, 0.1, generator=g)
                conv.kernel_projection.weight.normal_(0.0, 0.01, generator=g)
        sel = d.candidate_selector
        for p, std in (
            (sel.predecessor_codebook, 0.5),
            (sel.successor_codebook, 0.5),
            (sel.hidden_projection.weight, 0.1),
        ):
            p.normal_(0.0, std, generator=g)
    d.save(out / "drafter")
    tok = load_tokenizer(TINY / "target")
    lines = (TINY / "heldout_prompts.jsonl").read_text().splitlines()[:n_prompts]
    prompts = [tok(json.loads(x)["prompt"])["input_ids"][:prompt_tokens] for x in lines]
    (out / "prompts.json").write_text(json.dumps({"target": str(TINY / "target"), "prompts": prompts}))


def ours(out: Path, max_new: int) -> None:
    import torch

    sys.path.insert(0, str(ROOT))
    from dflash_trt.ingest import load_drafter
    from dflash_trt.model import Target, load_target
    from dflash_trt.runtime import generate

    spec = json.loads((out / "prompts.json").read_text())
    d = load_drafter(out / "drafter", dtype=torch.float32)
    target = Target(load_target(spec["target"], dtype=torch.float32), d.cfg.target_layer_ids)
    rows, start = [], time.perf_counter()
    for prompt in spec["prompts"]:
        commits: list[int] = []
        res = generate(target, d, [prompt], max_new_tokens=max_new, on_commit=lambda _r, t, c=commits: c.append(len(t)))
        rows.append({"tokens": res.token_ids[0], "acceptance_lengths": commits[1:]})  # [0]: prefill's token
    _write(out / "ours.json", rows, time.perf_counter() - start)


def authors(out: Path, max_new: int) -> None:
    import dflash.model as dm
    import torch
    from transformers import AutoModelForCausalLM

    dm._cuda_time = time.perf_counter  # its stats timer syncs CUDA; this run is on the CPU
    spec = json.loads((out / "prompts.json").read_text())
    target = AutoModelForCausalLM.from_pretrained(
        spec["target"], dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    draft = dm.DFlash2DraftModel.from_pretrained(
        str(out / "drafter"), dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    rows, start = [], time.perf_counter()
    for prompt in spec["prompts"]:
        ids = torch.tensor([prompt])
        res = dm.dflash_generate(draft, target, ids, max_new, None, temperature=0.0, return_stats=True)
        rows.append(
            {
                "tokens": res.output_ids[0, len(prompt) :].tolist(),
                "acceptance_lengths": [int(a) for a in res.acceptance_lengths],
            }
        )
    _write(out / "authors.json", rows, time.perf_counter() - start)


def _write(path: Path, rows: list[dict], seconds: float) -> None:
    path.write_text(json.dumps({"rows": rows, "seconds": seconds}))


def _full_rounds(acc: list[int], max_new: int, B: int) -> list[int]:
    """The rounds the authors run with a whole block: fewer than B tokens left shrinks it."""
    done, keep = 1, []  # the prefill's token
    for a in acc:
        if max_new - done < B:
            break
        keep.append(a)
        done += a
    return keep


def compare(out: Path, max_new: int) -> int:
    a, o = (json.loads((out / f"{n}.json").read_text()) for n in ("authors", "ours"))
    B = json.loads((out / "drafter" / "config.json").read_text())["dflash_config"]["block_size"]
    same_tokens = all(x["tokens"] == y["tokens"] for x, y in zip(a["rows"], o["rows"], strict=True))
    fa = [r for x in a["rows"] for r in _full_rounds(x["acceptance_lengths"], max_new, B)]
    fo = [r for x in o["rows"] for r in _full_rounds(x["acceptance_lengths"], max_new, B)]
    tau = lambda xs: sum(xs) / len(xs)  # noqa: E731
    all_a = [r for x in a["rows"] for r in x["acceptance_lengths"]]
    all_o = [r for x in o["rows"] for r in x["acceptance_lengths"]]
    report = {
        "prompts": len(o["rows"]),
        "max_new_tokens": max_new,
        "block_size": B,
        "same_tokens": same_tokens,
        "full_block_rounds": len(fo),
        "same_full_rounds": fa == fo,
        "tau_full_rounds": {"authors": round(tau(fa), 4), "dflash_trt": round(tau(fo), 4)},
        "tau_all_rounds": {"authors": round(tau(all_a), 4), "dflash_trt": round(tau(all_o), 4)},
        "seconds": {"authors": round(a["seconds"], 2), "dflash_trt": round(o["seconds"], 2)},
    }
    print(json.dumps(report, indent=2))
    return 0 if same_tokens and fa == fo else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["prepare", "ours", "authors", "compare"])
    ap.add_argument("out", type=Path)
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--max-new", type=int, default=96)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.step == "prepare":
        prepare(a.out, a.prompts, a.prompt_tokens)
    elif a.step == "ours":
        ours(a.out, a.max_new)
    elif a.step == "authors":
        authors(a.out, a.max_new)
    else:
        return compare(a.out, a.max_new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
