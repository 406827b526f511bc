"""Peak memory per training rank: FSDP2 over 2 gloo ranks against one unsharded process (CPU).

    python bench/train_memory.py [--size tiny|1b|both] [--steps 3] [--engines none,fsdp,ddp]

``tiny`` is the embedded pair's target; ``1b`` a random Qwen3 target of about 1.2B parameters
built from a config (hidden 2048, 20 layers, vocabulary 32000, bfloat16 as a real one ships; the
embedded target's tokenizer). Each engine trains a 1-layer drafter for ``--steps`` steps on the
same regenerated data: ``none`` in one process, ``fsdp`` and ``ddp`` as 2 ranks under torchrun.
Every rank reports two figures read from ``/proc/self/status`` (Linux):

* ``train_peak_mb``: the peak resident memory from the moment the target is sharded (the
  kernel's high-water mark reset there through ``/proc/self/clear_refs``) to the end: the
  training steps and the checkpoints;
* ``run_peak_mb``: the peak over the whole run, loading the target and regenerating included
  (every rank loads the whole target before sharding it).

Prints one JSON line per (size, engine) and a markdown table. CPU, gloo: figures of memory, not
of speed. Every run has ``MALLOC_MMAP_THRESHOLD_=1048576`` (see :func:`run`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "dflash_trt" / "assets" / "tiny" / "target"
STEP_FLAGS = [
    "--block-size",
    "4",
    "--layers",
    "1",
    "--batch-size",
    "2",
    "--anchors",
    "4",
    "--prompt-len",
    "16",
    "--gen-len",
    "8",
    "--samples",
    "4",
    "--eval-prompts",
    "0",
    "--save-every",
    "1000",
]


def _status(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def worker(argv: list[str], report: Path) -> None:
    """One rank: train with ``argv`` (the train-drafter flags), resetting the peak when the target is sharded."""
    import gc

    from dflash_trt.train import dist, train_drafter
    from dflash_trt.train.launcher import settings_from_argv

    marks = {}
    original = dist.shard_target

    def shard_then_reset(model, ranks):
        original(model, ranks)
        gc.collect()
        marks["run_peak_before_shard_mb"] = _status("VmHWM")
        Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark
        marks["rss_after_shard_mb"] = _status("VmRSS")

    dist.shard_target = shard_then_reset
    train_drafter(settings_from_argv(argv))
    rank = int(os.environ.get("RANK", "0"))
    figures = {
        "rank": rank,
        "train_peak_mb": round(_status("VmHWM"), 1),
        "run_peak_mb": round(max(marks["run_peak_before_shard_mb"], _status("VmHWM")), 1),
        "rss_after_shard_mb": round(marks["rss_after_shard_mb"], 1),
    }
    (report / f"rank{rank}.json").write_text(json.dumps(figures))


def random_target(dest: Path) -> Path:
    """A random ~1.2B-parameter Qwen3 in bfloat16, saved as safetensors, with the tiny tokenizer."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if (dest / "config.json").exists():
        return dest
    cfg = Qwen3Config(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=20,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: no fp32 copy of 1.2B weights
    model = Qwen3ForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    model.save_pretrained(dest, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY / f, dest / f)
    return dest


def run(target: Path, data: Path, engine: str, steps: int, work: Path) -> dict:
    out, report = work / f"out-{engine}", work / f"report-{engine}"
    for p in (out, report):
        shutil.rmtree(p, ignore_errors=True)
    report.mkdir(parents=True)
    flags = [
        "--target",
        str(target),
        "--data",
        str(data),
        "--out",
        str(out),
        "--steps",
        str(steps),
        *STEP_FLAGS,
        "--parallel",
        engine,
    ]
    # glibc's malloc serves blocks under its (self-raising, up to 32 MB) mmap threshold from arenas
    # it rarely gives back: FSDP's per-layer all-gather buffers, freed after each layer, would stay
    # counted. A fixed 1 MB threshold returns them; the same setting for every engine.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "1048576"}
    me = [str(Path(__file__).resolve()), "--worker", str(report), "--"]
    if engine == "none":
        cmd = [sys.executable, *me, *flags]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *me, *flags]
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode:
        sys.exit(f"{engine} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    ranks = [json.loads(p.read_text()) for p in sorted(report.glob("rank*.json"))]
    return {
        "engine": engine,
        "ranks": len(ranks),
        "train_peak_mb": max(r["train_peak_mb"] for r in ranks),
        "run_peak_mb": max(r["run_peak_mb"] for r in ranks),
        "per_rank": ranks,
    }


def main() -> None:
    if "--worker" in sys.argv:
        i = sys.argv.index("--worker")
        worker(sys.argv[i + 3 :], Path(sys.argv[i + 1]))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=("tiny", "1b", "both"), default="both")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--engines", default="none,fsdp,ddp")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "dflash-train-memory")
    a = p.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    data = a.work / "data.txt"
    data.write_text("".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(200)))
    sizes = ["tiny", "1b"] if a.size == "both" else [a.size]
    rows = []
    for size in sizes:
        target = TINY if size == "tiny" else random_target(a.work / "target-1b")
        for engine in a.engines.split(","):
            res = {"size": size, **run(target, data, engine, a.steps, a.work / size)}
            print(json.dumps(res), flush=True)
            rows.append(res)
    print("\n| target | engine | ranks | peak RSS per rank, training (MB) | peak RSS per rank, whole run (MB) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['size']} | {r['engine']} | {r['ranks']} | {r['train_peak_mb']:.0f} | {r['run_peak_mb']:.0f} |")


if __name__ == "__main__":
    main()
