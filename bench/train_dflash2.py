"""DFlash vs DFlash2 drafters trained by ``train-drafter`` on the embedded tiny target, same budget.

    python bench/train_dflash2.py [--steps 400] [--samples 1024] [--selector-rank 64] [--selector-top-k 8]

Trains one drafter of each architecture (2 layers, block 8, taps 1, 7, 13: the first shipped drafter's
shape) with the same data, seed, steps and learning rate, on the training split of this Python's
``Lib/*.py`` (the split ``scripts/train_tiny_target.py`` trained the target on: index % 8 == 5
held out), then runs ``dflash-trt bench`` (held-out standard-library prompts, greedy) on each.
Prints one JSON line per architecture: training's held-out τ, bench τ and speedup over
autoregressive decoding, parameters, wall time. CPU figures; the target is the embedded one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "dflash_trt" / "assets" / "tiny" / "target"


def training_split(dest: Path) -> Path:
    """Symlinks to the target's training files (sorted ``Lib/*.py``, every 8th from index 5 held out)."""
    dest.mkdir(parents=True, exist_ok=True)
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"), key=lambda p: p.name)
    for i, f in enumerate(files):
        link = dest / f.name
        if i % 8 != 5 and not link.exists():
            link.symlink_to(f)
    return dest


def train(arch: str, data: Path, out: Path, a) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "dflash_trt",
        "train-drafter",
        "--target",
        str(TARGET),
        "--data",
        str(data),
        "--out",
        str(out),
        "--arch",
        arch,
        "--block-size",
        "8",
        "--layers",
        "2",
        "--target-layer-ids",
        "1,7,13",
        "--steps",
        str(a.steps),
        "--batch-size",
        "8",
        "--anchors",
        "16",
        "--lr",
        "2e-3",
        "--prompt-len",
        "64",
        "--gen-len",
        "128",
        "--samples",
        str(a.samples),
        "--eval-every",
        str(a.steps),
        "--save-every",
        str(a.steps),
        "--seed",
        "0",
        "--json",
    ]
    if arch == "dflash2":  # the published sizes, but a rank and top-k sized to a hidden-128 target
        cmd += ["--selector-rank", str(a.selector_rank), "--selector-top-k", str(a.selector_top_k)]
    if out.exists() and (out / ".train" / "state.json").exists():
        cmd.append("--resume")
    t = time.perf_counter()
    res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout)
    res["train_seconds"] = round(time.perf_counter() - t, 1)
    return res


def bench(out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "dflash_trt",
        "bench",
        "--target",
        str(TARGET),
        "--drafter",
        str(out),
        "--prompts",
        str(TARGET.parent / "heldout_prompts.jsonl"),
        "--json",
    ]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--work", type=Path, default=ROOT / "build" / "train_dflash2")
    p.add_argument("--archs", default="dflash,dflash2")
    p.add_argument("--selector-rank", type=int, default=64)
    p.add_argument("--selector-top-k", type=int, default=8)
    a = p.parse_args()
    data = training_split(a.work / "train_files")
    for arch in a.archs.split(","):
        out = a.work / arch
        res = train(arch, data, out, a)
        b = bench(out)
        print(
            json.dumps(
                {
                    "arch": arch,
                    "steps": res["step"],
                    "loss": res["loss"],
                    "heldout_tau": res["heldout_tau"],
                    "train_seconds": res["train_seconds"],
                    "drafter_params": _params(out),
                    "bench_tau": b["acceptance_length"],
                    "bench_speedup": b["speedup"],
                    "lossless": b["lossless"],
                    "per_position_acceptance": b["per_position_acceptance"],
                    "draft_ms": b["step"]["draft_ms"],
                }
            ),
            flush=True,
        )


def _params(out: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        return sum(_numel(f.get_slice(k).get_shape()) for k in f.keys())


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


if __name__ == "__main__":
    main()
