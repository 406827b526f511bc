"""Batch-1 speed of the reference runtime against the DFlash authors' own loop, same pair, same process.

The authors' package (``dflash`` on PyPI, ``dflash/model.py``: ``DFlashDraftModel`` and
``dflash_generate``, their batch-1 loop) goes in its own environment, never the project's:

    python3 -m venv /tmp/dflash-venv
    /tmp/dflash-venv/bin/pip install torch==2.13.0
    /tmp/dflash-venv/bin/pip install "dflash[local]==0.1.0" pydantic pyyaml numpy typer rich huggingface_hub
    /tmp/dflash-venv/bin/python bench/vs_authors.py
    # or: python bench/vs_authors.py --python /tmp/dflash-venv/bin/python

Both loops run on the shipped embedded pair (or --target/--drafter), float32, one torch thread,
greedy, on the pair's held-out prompts: the same target module object for both, the authors'
drafter loaded from the same directory by their own class. Each prompt runs ``--repeats``
times per side, the two sides interleaved; a prompt's time is its fastest run, measured as
CPU time of the process (``time.process_time``: on a shared machine, time spent waiting for a
core is not counted) and reported with wall time too. Reported: tokens/s of each side, the
speedup, τ of each, and whether every output is identical. ``dflash_generate`` times itself
with ``torch.cuda.synchronize``; on a CPU its timer is replaced by ``time.perf_counter`` to
read its acceptance lengths (nothing else of theirs is changed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", help="re-run this script under that interpreter (the authors' venv)")
    p.add_argument("--target", default="embedded:tiny/target")
    p.add_argument("--drafter", default="embedded:tiny/drafter")
    p.add_argument("--prompts", type=int, default=8, help="held-out prompts to run (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON ('-' for stdout)")
    return p.parse_args(argv)


def timed(fn):
    c, w = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - c, time.perf_counter() - w


def main() -> int:
    a = parse_args()
    if a.python:
        argv = [x for x in sys.argv[1:] if not x.startswith("--python=")]
        if "--python" in argv:
            del argv[argv.index("--python") : argv.index("--python") + 2]
        os.execv(a.python, [a.python, __file__, *argv])
    import torch

    torch.set_num_threads(a.threads)
    import dflash.model as theirs

    from dflash_trt import ingest
    from dflash_trt.bench.inprocess import read_prompts
    from dflash_trt.runtime import generate, load_pair

    theirs._cuda_time = time.perf_counter  # their timer syncs CUDA; this is a CPU run
    pair = load_pair(a.target, a.drafter, dtype="float32")
    their_drafter = theirs.DFlashDraftModel.from_pretrained(
        str(ingest.resolve(a.drafter, role="drafter")), dtype=torch.float32
    ).eval()
    texts = read_prompts(ingest.embedded_dir("tiny") / "heldout_prompts.jsonl")[: a.prompts]
    prompts = [pair.encode(t) for t in texts]
    stops, n = pair.stop_token_ids, a.max_new_tokens

    def ours(p):
        g = generate(pair.target, pair.drafter, [p], max_new_tokens=n, stop_token_ids=stops)
        return g.token_ids[0], g.stats.rounds, g.stats.committed

    def authors(p):
        r = theirs.dflash_generate(their_drafter, pair.target.model, torch.tensor([p]), n, stops, return_stats=True)
        return r.output_ids[0, len(p) :].tolist(), len(r.acceptance_lengths), sum(r.acceptance_lengths)

    sides = {"runtime": ours, "authors": authors}
    for fn in sides.values():  # warm-up: allocator, first-call costs
        fn(prompts[0][:32])
    best = {k: [[float("inf"), float("inf")] for _ in prompts] for k in sides}
    result = {k: [None] * len(prompts) for k in sides}
    for rep in range(a.repeats):
        for i, p in enumerate(prompts):
            order = list(sides) if (rep + i) % 2 == 0 else list(reversed(sides))
            for k in order:
                out, cpu, wall = timed(partial(sides[k], p))
                best[k][i] = [min(best[k][i][0], cpu), min(best[k][i][1], wall)]
                result[k][i] = out
    report = {
        "prompts": len(prompts),
        "max_new_tokens": n,
        "threads": a.threads,
        "dtype": "float32",
        "identical_tokens": [r[0] for r in result["runtime"]] == [r[0] for r in result["authors"]],
    }
    for k in sides:
        tokens = sum(len(r[0]) for r in result[k])
        cpu, wall = sum(b[0] for b in best[k]), sum(b[1] for b in best[k])
        report[k] = {
            "tokens": tokens,
            "cpu_seconds": round(cpu, 4),
            "wall_seconds": round(wall, 4),
            "tokens_per_cpu_second": round(tokens / cpu, 2),
            "tokens_per_second": round(tokens / wall, 2),
            "acceptance_length": round(sum(r[2] for r in result[k]) / sum(r[1] for r in result[k]), 4),
        }
    report["speedup_cpu"] = round(
        report["runtime"]["tokens_per_cpu_second"] / report["authors"]["tokens_per_cpu_second"], 3
    )
    report["speedup_wall"] = round(report["runtime"]["tokens_per_second"] / report["authors"]["tokens_per_second"], 3)
    print(
        f"runtime {report['runtime']['tokens_per_cpu_second']} tok/CPU-s "
        f"(wall {report['runtime']['tokens_per_second']}), "
        f"authors {report['authors']['tokens_per_cpu_second']} (wall {report['authors']['tokens_per_second']}): "
        f"{report['speedup_cpu']}x CPU, {report['speedup_wall']}x wall; "
        f"τ {report['runtime']['acceptance_length']} vs "
        f"{report['authors']['acceptance_length']}; identical tokens: {report['identical_tokens']}"
    )
    if a.json:
        text = json.dumps(report, indent=2)
        print(text) if a.json == "-" else Path(a.json).write_text(text + "\n")
    return 0 if report["identical_tokens"] else 1


if __name__ == "__main__":
    sys.exit(main())
