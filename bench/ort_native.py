"""DFlash vs autoregressive through each backend of one bundle, at batch 1 and 4 (issue #28).

    python bench/ort_native.py BUNDLE --prompts P.jsonl [-n 128] [--batches 1,4] [--json]

Backends: ``torch`` (the PyTorch modules), ``onnx`` (every graph native, the drafter through
``drafter_ort.onnx``) and ``onnx-customop`` (the drafter through ``drafter.onnx``'s Python custom
ops: the path before the native form). At batch b the prompts run b at a time (one ``generate``
call per group, greedy); per backend and batch: tokens/s of DFlash and autoregressive, their
ratio, τ, the round's draft / verify seconds, and ``lossless`` (DFlash token-identical to the
same backend's autoregressive decoding *and* to torch's).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from dflash_trt import ingest
from dflash_trt.bench.inprocess import read_prompts
from dflash_trt.runtime import generate, load_bundle, resolve_run
from dflash_trt.runtime.onnx_backend import OnnxBackend


def backend_for(kind: str, bundle: str, pair):
    if kind == "torch":
        return None
    if kind == "onnx":
        return load_bundle(bundle, resolve_run("onnx", bundle=bundle)).backend
    b = ingest.open_bundle(bundle)
    return OnnxBackend(b.onnx, b.manifest.engine.profile, pair.drafter.cfg.mask_token_id, native=False)


def measure(pair, backend, prompts: list[list[int]], batch: int, n: int) -> dict:
    B = pair.block_size()
    stops = pair.stop_token_ids
    generate(pair.target, pair.drafter, prompts[:batch], max_new_tokens=8, block_size=B, stop_token_ids=stops,
             backend=backend)                                                       # warm-up
    out: dict = {"dflash": [], "ar": [], "draft_s": 0.0, "verify_s": 0.0, "rounds": 0, "committed": 0}
    secs = {"dflash": 0.0, "ar": 0.0}
    new = {"dflash": 0, "ar": 0}
    for i in range(0, len(prompts), batch):
        group = prompts[i:i + batch]
        for mode, drafter, bs in (("dflash", pair.drafter, B), ("ar", None, 1)):
            t0 = time.perf_counter()
            g = generate(pair.target, drafter, group, max_new_tokens=n, block_size=bs, stop_token_ids=stops,
                         backend=backend)
            secs[mode] += time.perf_counter() - t0
            new[mode] += sum(len(x) for x in g.token_ids)
            out[mode] += g.token_ids
            if mode == "dflash":
                out["draft_s"] += g.stats.draft_seconds
                out["verify_s"] += g.stats.verify_seconds
                out["rounds"] += g.stats.rounds
                out["committed"] += g.stats.committed
    tps = {m: new[m] / secs[m] for m in secs}
    return {"dflash_tok_s": round(tps["dflash"], 1), "ar_tok_s": round(tps["ar"], 1),
            "speedup": round(tps["dflash"] / tps["ar"], 3), "tau": round(out["committed"] / max(1, out["rounds"]), 3),
            "draft_s": round(out["draft_s"], 3), "verify_s": round(out["verify_s"], 3),
            "lossless_self": out["dflash"] == out["ar"], "tokens": out["dflash"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("-n", "--max-new-tokens", type=int, default=128)
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--backends", default="torch,onnx,onnx-customop")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)          # what dflash-trt bench picks for the embedded pair (_cli.common)
    pair = load_bundle(args.bundle)
    prompts = [pair.encode(t) for t in read_prompts(args.prompts)]
    rows = []
    reference: dict[int, list] = {}
    for kind in args.backends.split(","):
        backend = backend_for(kind, args.bundle, pair)
        for batch in (int(x) for x in args.batches.split(",")):
            r = measure(pair, backend, prompts, batch, args.max_new_tokens)
            tokens = r.pop("tokens")
            reference.setdefault(batch, tokens)
            r.update(backend=kind, batch=batch, lossless_vs_first=tokens == reference[batch])
            rows.append(r)
            if not args.json:
                print(r, flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
