"""A short request behind long ones on one backend of a bundle, through the embedded server's
batch worker (issue #48): how long the short one takes when it arrives while long ones run.

    python bench/short_behind_long.py BUNDLE [--backend onnx] [--repeats 3]

Per repeat: ``--long`` greedy jobs of ``--long-tokens`` tokens start; once each has taken its
first token, one job of ``--short-tokens`` tokens is submitted. Reported (seconds, median and
spread over the repeats): the short job's latency (submitted -> done), the long jobs' makespan,
and ``short_alone`` (the same short job on an idle worker). The worker batches continuously:
the short job joins at the next round (before #48 the graph backends batched statically and it
waited for the long batch to end: ``bench/results/2026-12-03-one-serving-path.json``). Its
tokens are checked against the target's greedy decoding through the same backend
(``lossless``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import torch

from dflash_trt.runtime import generate, load_bundle, resolve_run
from dflash_trt.serve.batcher import Job
from dflash_trt.serve.continuous import ContinuousBatcher


def worker(pair, max_batch: int) -> ContinuousBatcher:
    w = ContinuousBatcher(pair, max_batch=max_batch, max_queue=64, torch_threads=1)
    w.start()
    return w


def run_job(w, prompt: list[int], n: int) -> tuple[Job, threading.Event]:
    done = threading.Event()
    job = Job.new(
        prompt, n, ignore_eos=True, sink=lambda kind, _payload: done.set() if kind in ("done", "error") else None
    )
    w.submit(job)
    return job, done


def one(w, prompts, args) -> dict:
    longs = [run_job(w, prompts[i % len(prompts)], args.long_tokens) for i in range(args.long)]
    t0 = time.perf_counter()
    while any(j.first_token_at is None for j, _ in longs):
        time.sleep(0.001)
    short, done = run_job(w, prompts[-1], args.short_tokens)
    done.wait(600)
    for _, d in longs:
        d.wait(600)
    return {
        "short_s": short.finished_at - short.enqueued_at,
        "long_makespan_s": max(j.finished_at for j, _ in longs) - t0,
        "short_tokens": short.tokens,
    }


def spread(xs: list[float]) -> dict:
    return {
        "median": round(statistics.median(xs), 3),
        "min": round(min(xs), 3),
        "max": round(max(xs), 3),
        "runs": [round(x, 3) for x in xs],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--backend", default="onnx")
    ap.add_argument("--long", type=int, default=3)
    ap.add_argument("--long-tokens", type=int, default=96)
    ap.add_argument("--short-tokens", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    pair = load_bundle(args.bundle, resolve_run(args.backend, bundle=args.bundle))
    prompts = [pair.encode(t) for t in ("def add(a, b):", "import os\n", "class Point:", "# a short one\n")]
    w = worker(pair, max_batch=args.long + 1)
    runs = [one(w, prompts, args) for _ in range(args.repeats)]
    alone = []
    for _ in range(args.repeats):
        job, done = run_job(w, prompts[-1], args.short_tokens)
        done.wait(600)
        alone.append(job.finished_at - job.enqueued_at)
    w.stop(60)
    ref = generate(
        None, None, [prompts[-1]], max_new_tokens=args.short_tokens, block_size=1, backend=pair.backend
    ).token_ids[0]
    print(
        json.dumps(
            {
                "backend": args.backend,
                "batching": "continuous",
                "long": args.long,
                "long_tokens": args.long_tokens,
                "short_tokens": args.short_tokens,
                "short_s": spread([r["short_s"] for r in runs]),
                "long_makespan_s": spread([r["long_makespan_s"] for r in runs]),
                "short_alone_s": spread(alone),
                "lossless": all(r["short_tokens"] == ref for r in runs),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
