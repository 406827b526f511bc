"""Device check of the standalone path: the speculative loop through the TensorRT engines (GPU), next
to ONNX Runtime and the PyTorch reference, on one bundle built with ``--graphs``.

Builds the embedded tiny recipe with ``--graphs`` (engines are built where TensorRT and a
GPU are) unless ``--bundle`` names one, then generates greedily through every backend asked for,
at each batch size, and reports per backend: τ, per-position acceptance, tokens/s, and whether
every output is token-identical to the PyTorch backend's (the target's own greedy decoding).

    python bench/engines.py                                  # build tiny, torch vs onnx vs tensorrt
    python bench/engines.py --bundle OUT --batch 1 3 8 --json out.json

Exit status: 0 when every backend that ran matched the reference; 1 on a mismatch; 2 (one line)
when a backend cannot run here (e.g. no TensorRT: its refusal is the line).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bundle", type=Path, help="a bundle built with --graphs (default: build tiny)")
    p.add_argument("--backends", nargs="+", default=["torch", "onnx", "tensorrt"])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 3])
    p.add_argument("--prompts", type=int, default=6, help="held-out prompts of the tiny pair to run")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON ('-' for stdout)")
    return p.parse_args(argv)


def build_tiny(out: Path) -> Path:
    """``dflash-trt build --graphs -o out`` in a subprocess (its own progress on stderr)."""
    cmd = [sys.executable, "-m", "dflash_trt", "build", "--graphs", "-o", str(out)]
    subprocess.run(cmd, check=True)
    return out


def run_backend(pair, name: str, bundle: Path, prompts: list[list[int]], batches: list[int], max_new: int) -> dict:
    """Every prompt through one backend at each batch size: tokens, τ, tokens/s."""
    from dflash_trt.runtime import generate, load_bundle, resolve_run

    backend = load_bundle(bundle, resolve_run(name, bundle=bundle)).backend
    generate(pair.target, pair.drafter, prompts[:1], max_new_tokens=8, backend=backend)  # warm-up
    out = {}
    for b in batches:
        tokens, committed, rounds, new, seconds = [], 0, 0, 0, 0.0
        for i in range(0, len(prompts), b):
            t = time.perf_counter()
            g = generate(pair.target, pair.drafter, prompts[i : i + b], max_new_tokens=max_new, backend=backend)
            seconds += time.perf_counter() - t
            tokens += g.token_ids
            committed, rounds, new = committed + g.stats.committed, rounds + g.stats.rounds, new + g.stats.new_tokens
        out[b] = {
            "token_ids": tokens,
            "acceptance_length": round(committed / max(rounds, 1), 4),
            "tokens_per_second": round(new / seconds, 2),
            "seconds": round(seconds, 3),
        }
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    from dflash_trt import ingest
    from dflash_trt.bench.inprocess import read_prompts
    from dflash_trt.errors import DFlashError
    from dflash_trt.runtime import load_bundle

    with tempfile.TemporaryDirectory() as tmp:
        bundle = args.bundle or build_tiny(Path(tmp) / "tiny-trt")
        pair = load_bundle(bundle)
        texts = read_prompts(ingest.embedded_dir("tiny") / "heldout_prompts.jsonl")[: args.prompts]
        prompts = [pair.encode(t) for t in texts]
        report, refused = {"bundle": str(bundle), "max_new_tokens": args.max_new_tokens, "backends": {}}, None
        for name in args.backends:
            try:
                report["backends"][name] = run_backend(pair, name, bundle, prompts, args.batch, args.max_new_tokens)
            except DFlashError as exc:
                refused = refused or str(exc)
                report["backends"][name] = {"refused": str(exc)}
    ref = report["backends"].get("torch", {})
    ok = True
    for name, runs in report["backends"].items():
        for b, r in runs.items() if "refused" not in runs else ():
            r["identical_to_torch"] = r["token_ids"] == ref.get(b, {}).get("token_ids")
            ok &= r["identical_to_torch"]
            print(
                f"{name:9s} batch {b}: tau {r['acceptance_length']:.2f}  {r['tokens_per_second']:8.1f} tok/s  "
                f"identical to torch: {r['identical_to_torch']}"
            )
    for r in (r for runs in report["backends"].values() for r in runs.values() if isinstance(r, dict)):
        r.pop("token_ids", None)
    if args.json:
        doc = json.dumps(report, indent=2)
        sys.stdout.write(doc + "\n") if args.json == "-" else Path(args.json).write_text(doc + "\n")
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
