"""The embedded server (continuous batching) on a bundle (default: the tiny one).

    python bench/serving.py [BUNDLE] [--concurrency 1,4,16,64] [--max-tokens 32] [--json out.json]

The server runs in this process (``ServerThread``) and
``dflash_trt.bench.endpoint`` drives it over HTTP: output tokens/s, TTFT and ITL (median, p99)
and τ per concurrency level, ``--requests`` per level (default 2 x concurrency, at least 8).
Then the short-behind-long case: two long requests (``--long`` tokens) start, and once both
stream, ``--shorts`` short requests (8 tokens) arrive; reported are the median latency of the
short ones and of the long ones. Greedy, ``ignore_eos`` so every request runs its full length.
Without BUNDLE the tiny recipe is built into a temporary directory first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle", nargs="?", type=Path)
    p.add_argument("--concurrency", default="1,4,16,64")
    p.add_argument("--requests", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--max-batch", type=int, default=None, help="default: the bundle's planned max_batch_size")
    p.add_argument("--long", type=int, default=600)
    p.add_argument("--shorts", type=int, default=6)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server's worker")
    p.add_argument("--json", metavar="PATH")
    return p.parse_args(argv)


async def short_behind_long(url: str, long_tokens: int, shorts: int) -> dict:
    """Latencies (s) of two long requests and of short ones sent once both long ones stream."""
    import httpx

    async def stream(c, body, started=None):
        t0 = time.perf_counter()
        async with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: ") and started is not None:
                    started.set()
        return time.perf_counter() - t0

    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        flags = [asyncio.Event(), asyncio.Event()]
        longs = [
            asyncio.create_task(
                stream(
                    c, {"prompt": f"def long_{i}(", "max_tokens": long_tokens, "temperature": 0, "ignore_eos": True}, f
                )
            )
            for i, f in enumerate(flags)
        ]
        for f in flags:
            await f.wait()
        short = await asyncio.gather(
            *(
                stream(c, {"prompt": f"x{i} = ", "max_tokens": 8, "temperature": 0, "ignore_eos": True})
                for i in range(shorts)
            )
        )
        long = await asyncio.gather(*longs)
    return {"short_median_s": round(statistics.median(short), 3), "long_median_s": round(statistics.median(long), 3)}


def run_mode(pair, batching: str, a, levels: list[int]) -> dict:
    from dflash_trt.bench import endpoint
    from dflash_trt.serve import ServerThread, create_app

    app = create_app(pair, "tiny", max_batch=a.max_batch, max_queue=1024, torch_threads=a.threads)
    with ServerThread(app) as srv:
        report = endpoint.run(
            srv.url, concurrency=levels, requests=a.requests, max_tokens=a.max_tokens, ignore_eos=True
        )
        hol = asyncio.run(short_behind_long(srv.url, a.long, a.shorts))
    rows = [
        {
            k: lv[k]
            for k in (
                "concurrency",
                "ok",
                "requests",
                "output_tokens_per_second",
                "ttft_ms",
                "itl_ms",
                "acceptance_length",
            )
        }
        for lv in report["endpoint"]["levels"]
    ]
    return {"max_batch": app.state.batcher.max_batch, "levels": rows, "short_behind_long": hol}


def main() -> int:
    a = parse_args()
    from dflash_trt.runtime import load_bundle

    levels = [int(x) for x in a.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        bundle = a.bundle
        if bundle is None:
            from dflash_trt.cli import run

            bundle = Path(tmp) / "tiny"
            assert run(["build", "-o", str(bundle)]) == 0
        pair = load_bundle(bundle, dtype="float32")
        out = {
            "bundle": str(a.bundle or "tiny recipe"),
            "max_tokens": a.max_tokens,
            "threads": a.threads,
            "modes": {"continuous": run_mode(pair, "continuous", a, levels)},
        }
    for mode, r in out["modes"].items():
        print(f"{mode} (max batch {r['max_batch']}):")
        for lv in r["levels"]:
            print(
                f"  c={lv['concurrency']:>3}  {lv['output_tokens_per_second']:8.1f} tok/s  "
                f"TTFT p50 {lv['ttft_ms']['median']} p99 {lv['ttft_ms']['p99']} ms  "
                f"ITL p50 {lv['itl_ms']['median']} p99 {lv['itl_ms']['p99']} ms  τ {lv['acceptance_length']}"
            )
        h = r["short_behind_long"]
        print(f"  short behind long: shorts {h['short_median_s']} s, longs {h['long_median_s']} s")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
