"""DFlash against autoregressive on the embedded server, closed loop and open loop: the measured
example of docs/guides/reading-benchmarks.md.

    python bench/reading_benchmarks.py [BUNDLE] [--concurrency 1,4] [--request-rate 2,8] [--repeats 3]
        [--max-tokens 32] [--requests 12] [--out bench/results/DATE-reading-benchmarks.json]

Two servers run in this process on the bundle (default: the tiny recipe built into a temporary
directory): one drafting (the bundle's block size), one not (block size 1). ``dflash_trt.bench.
endpoint`` drives both with the package's categorized verify prompts (code, math, prose, chat),
greedy, ``ignore_eos``; every level is warmed up and repeated. The JSON keeps the report (levels
with their spreads, the comparison, per-category figures) without the raw per-request records.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle", nargs="?", type=Path)
    p.add_argument("--concurrency", default="1,4")
    p.add_argument("--request-rate", default="2,8")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--requests", type=int, default=12)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)

    from dflash_trt.bench import datasets
    from dflash_trt.bench import endpoint as loadgen
    from dflash_trt.bench.verify import PROMPTS
    from dflash_trt.cli import run
    from dflash_trt.runtime import load_bundle
    from dflash_trt.serve import ServerThread, create_app

    with tempfile.TemporaryDirectory() as tmp:
        bundle = a.bundle
        if bundle is None:
            bundle = Path(tmp) / "tiny"
            assert run(["build", "tiny", "-o", str(bundle)]) == 0
        pair = load_bundle(bundle)
        with (
            ServerThread(create_app(pair, "tiny", max_batch=8)) as dflash,
            ServerThread(create_app(pair, "tiny-ar", max_batch=8, block_size=1)) as ar,
        ):
            report = loadgen.run(
                dflash.url,
                baseline=ar.url,
                prompts=datasets.load(PROMPTS),
                concurrency=[int(c) for c in a.concurrency.split(",")],
                request_rate=[float(r) for r in a.request_rate.split(",")],
                requests=a.requests,
                repeats=a.repeats,
                max_tokens=a.max_tokens,
                ignore_eos=True,
            )
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    today = dt.date.today().isoformat()
    out = {
        "date": today,
        "machine": "shared 2-core development CPU, no GPU (other work running beside it)",
        "commit": commit,
        "command": "python bench/reading_benchmarks.py " + " ".join(argv or sys.argv[1:]),
        "results": report,
    }
    path = a.out or Path(__file__).parent / "results" / f"{today}-reading-benchmarks.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(path)


if __name__ == "__main__":
    main()
