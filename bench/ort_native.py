"""DFlash vs autoregressive through each backend of one bundle, at batch 1 and 4 (issue #28).

    python bench/ort_native.py BUNDLE --prompts P.jsonl [-n 128] [--batches 1,4] [--threads 1] [--continuous] [--json]

Backends: ``torch`` (the PyTorch modules), ``onnx`` (every graph native: the drafter through
``drafter_ort.onnx``, the target through ``target_ort.onnx`` where the bundle has it) and
``onnx-customop`` (the drafter through ``drafter.onnx``'s Python custom ops and the target through
``target.onnx``: the path before the native forms). At batch b the prompts run b at a time (one ``generate``
call per group, greedy); per backend and batch: tokens/s of DFlash and autoregressive, their
ratio, τ, the round's draft / verify seconds, and ``lossless`` (DFlash token-identical to the
same backend's autoregressive decoding *and* to torch's).

The split per DFlash round, in milliseconds: ``draft_ms`` (the drafter round), ``verify_ms`` (the
target forward over the block, its cache bookkeeping included) and, within it, ``cache_ms`` (the
backend's ``compact`` + ``commit_cache``: the target cache's compaction or in-place commit).
``decode_speedup`` is the ratio without the prompts' prefill (the same work in both modes),
``prefill_share`` the prefill's part of DFlash's time, and ``free_draft_bound`` the ratio DFlash
would reach if its drafter rounds cost nothing: what the verify forwards, the loop and a static
batch's tail allow on this machine, whatever the drafter graph does.
``--continuous``: the prompts go through one scheduler of ``batch`` live rows instead (a row that
finishes gives its place to the next prompt at the next round, as the server batches): tokens/s,
ratio and ``lossless`` only.
``rounds_per_row`` (a row's DFlash rounds, mean) against ``rounds_per_group`` (a ``generate`` call's
batched rounds, mean): a static batch runs until its slowest row is done, the rows that finished
early leave it smaller. ``cpu_speedup`` is the same ratio in this process's CPU seconds (one thread each: on a machine
shared with other jobs it moves less with their load than the wall-clock ratio does).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from dflash_trt import ingest
from dflash_trt.bench.inprocess import read_prompts
from dflash_trt.runtime import Request, Scheduler, TorchBackend, generate, load_bundle, resolve_run
from dflash_trt.runtime.onnx_backend import OnnxBackend


def backend_for(kind: str, bundle: str, pair):
    if kind == "torch":
        return TorchBackend(pair.target, pair.drafter)
    if kind == "onnx":
        return load_bundle(bundle, resolve_run("onnx", bundle=bundle)).backend
    b = ingest.open_bundle(bundle)
    return OnnxBackend(b.onnx, b.manifest.graphs.profile, pair.drafter.cfg.mask_token_id, native=False)


def timed_cache(backend) -> dict:
    """Seconds the backend spends in its target-cache bookkeeping (``compact``, ``commit_cache``),
    accumulated in the returned dict's "s" while a DFlash run is on ("on")."""
    acc = {"s": 0.0, "on": False}
    for name in ("compact", "commit_cache"):
        method = getattr(backend, name)

        def wrapped(*a, _m=method, **k):
            t0 = time.perf_counter()
            try:
                return _m(*a, **k)
            finally:
                acc["s"] += (time.perf_counter() - t0) if acc["on"] else 0.0

        setattr(backend, name, wrapped)
    return acc


def measure(pair, backend, prompts: list[list[int]], batch: int, n: int) -> dict:
    B = pair.block_size()
    cache = timed_cache(backend)
    stops = pair.stop_token_ids
    generate(
        pair.target,
        pair.drafter,
        prompts[:batch],
        max_new_tokens=8,
        block_size=B,
        stop_token_ids=stops,
        backend=backend,
    )  # warm-up
    out: dict = {
        "dflash": [],
        "ar": [],
        "draft_s": 0.0,
        "verify_s": 0.0,
        "rounds": 0,
        "committed": 0,
        "batch_rounds": 0,
    }
    secs = {"dflash": 0.0, "ar": 0.0}
    prefill = {"dflash": 0.0, "ar": 0.0}
    cpu = {"dflash": 0.0, "ar": 0.0}
    new = {"dflash": 0, "ar": 0}
    for i in range(0, len(prompts), batch):
        group = prompts[i : i + batch]
        for mode, drafter, bs in (("dflash", pair.drafter, B), ("ar", None, 1)):
            cache["on"] = mode == "dflash"
            t0, c0 = time.perf_counter(), time.process_time()
            g = generate(
                pair.target, drafter, group, max_new_tokens=n, block_size=bs, stop_token_ids=stops, backend=backend
            )
            secs[mode] += time.perf_counter() - t0
            prefill[mode] += g.stats.prefill_seconds
            cpu[mode] += time.process_time() - c0
            new[mode] += sum(len(x) for x in g.token_ids)
            out[mode] += g.token_ids
            if mode == "dflash":
                out["draft_s"] += g.stats.draft_seconds
                out["verify_s"] += g.stats.verify_seconds
                out["rounds"] += g.stats.rounds
                out["batch_rounds"] += g.stats.target_forwards - 1  # a batched round per forward but prefill
                out["committed"] += g.stats.committed
    tps = {m: new[m] / secs[m] for m in secs}
    per_round = 1e3 / max(1, out["batch_rounds"])
    return {
        "dflash_tok_s": round(tps["dflash"], 1),
        "ar_tok_s": round(tps["ar"], 1),
        "speedup": round(tps["dflash"] / tps["ar"], 3),
        "cpu_speedup": round(cpu["ar"] / new["ar"] / (cpu["dflash"] / new["dflash"]), 3),
        "tau": round(out["committed"] / max(1, out["rounds"]), 3),
        # the prompts' prefill is the same work in both modes and dilutes the ratio: without it
        "decode_speedup": round((secs["ar"] - prefill["ar"]) / (secs["dflash"] - prefill["dflash"]), 3),
        # the ratio if the drafter rounds cost nothing (prefill in): what the verify, the
        # loop and the static batch's tail alone allow
        "free_draft_bound": round(secs["ar"] / new["ar"] / ((secs["dflash"] - out["draft_s"]) / new["dflash"]), 3),
        "prefill_share": round(prefill["dflash"] / secs["dflash"], 3),
        "draft_s": round(out["draft_s"], 3),
        "verify_s": round(out["verify_s"], 3),
        "draft_ms": round(out["draft_s"] * per_round, 2),
        "verify_ms": round(out["verify_s"] * per_round, 2),
        "cache_ms": round(cache["s"] * per_round, 2),
        # static batching waits for a group's slowest row: its rounds against the mean row's
        "rounds_per_row": round(out["rounds"] / len(prompts), 1),
        "rounds_per_group": round(out["batch_rounds"] / -(-len(prompts) // batch), 1),
        "lossless_self": out["dflash"] == out["ar"],
        "tokens": out["dflash"],
    }


def through_scheduler(backend, prompts: list[list[int]], batch: int, n: int, block_size: int, stops) -> tuple:
    """Every prompt through one scheduler of ``batch`` live rows (a row that finishes is replaced
    by the next prompt at the next round): (token ids per prompt, seconds)."""
    reqs = [Request(p, n, stop_token_ids=frozenset(stops)) for p in prompts]
    sched = Scheduler(backend, block_size=block_size, max_batch=batch)
    t0 = time.perf_counter()
    for r in reqs:
        sched.add(r)
    while not sched.idle:
        sched.step()
    return [r.token_ids for r in reqs], time.perf_counter() - t0


def measure_continuous(pair, backend, prompts: list[list[int]], batch: int, n: int) -> dict:
    """DFlash against autoregressive with continuous batching (``--continuous``): tokens/s of each,
    their ratio, and ``lossless_self`` (DFlash's tokens equal autoregressive decoding's)."""
    B, stops = pair.block_size(), pair.stop_token_ids
    through_scheduler(backend, prompts[:batch], batch, 8, B, stops)  # warm-up
    toks, secs = {}, {}
    for mode, bs in (("dflash", B), ("ar", 1)):
        toks[mode], secs[mode] = through_scheduler(backend, prompts, batch, n, bs, stops)
    tps = {m: sum(len(x) for x in toks[m]) / secs[m] for m in secs}
    return {
        "dflash_tok_s": round(tps["dflash"], 1),
        "ar_tok_s": round(tps["ar"], 1),
        "speedup": round(tps["dflash"] / tps["ar"], 3),
        "lossless_self": toks["dflash"] == toks["ar"],
        "tokens": toks["dflash"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("-n", "--max-new-tokens", type=int, default=128)
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--backends", default="torch,onnx,onnx-customop")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch and onnxruntime intra-op threads (1: dflash-trt bench's choice for the embedded pair)",
    )
    ap.add_argument(
        "--continuous",
        action="store_true",
        help="run every prompt through one scheduler of BATCH live rows (continuous batching: a "
        "finished row's place goes to the next prompt) instead of generate() per group of BATCH",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_bundle(args.bundle)
    prompts = [pair.encode(t) for t in read_prompts(args.prompts)]
    rows = []
    reference: dict[int, list] = {}
    for kind in args.backends.split(","):
        backend = backend_for(kind, args.bundle, pair)
        for batch in (int(x) for x in args.batches.split(",")):
            r = (measure_continuous if args.continuous else measure)(pair, backend, prompts, batch, args.max_new_tokens)
            tokens = r.pop("tokens")
            reference.setdefault(batch, tokens)
            r.update(
                backend=kind, batch=batch, continuous=args.continuous, lossless_vs_first=tokens == reference[batch]
            )
            rows.append(r)
            if not args.json:
                print(r, flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
