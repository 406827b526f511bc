"""Refit the planner's step model on the published measurements and print every row's error.

    python bench/fit_perf_model.py            # fit, leave-one-out table, trends
    python bench/fit_perf_model.py --write    # ... and write dflash_trt/assets/perf/calibration.json
    python bench/fit_perf_model.py --add-tune tune.json --source "..."   # this machine's CPU rows

``--add-tune`` replaces the CPU rows (stack ``reference``) of the measurements file with the
levels of ``dflash-trt tune BUNDLE --dry-run --json`` (the embedded tiny pair on this machine).

Reads ``dflash_trt/assets/perf/measurements.json`` (one row per published measurement, with its
source). For every row: what was measured, what the full fit predicts, and what a fit WITHOUT
that row predicts (leave-one-out: the error a new deployment like it should expect). Then, per
model with several concurrencies, whether the predicted speedup moves the way the measured one
does. The CPU rows (stack ``reference``) are this project's own ``dflash-trt bench`` runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    from dflash_trt.plan import perf_fit, perf_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write the fitted constants into the package")
    ap.add_argument("--json", type=Path, help="also write the table as JSON here")
    ap.add_argument("--add-tune", type=Path, help="replace the CPU rows with this `tune --json` output")
    ap.add_argument("--source", default="dflash-trt tune on the development CPU", help="with --add-tune: where from")
    ap.add_argument("--max-tokens", type=int, default=64, help="with --add-tune: the sweep's --max-tokens")
    args = ap.parse_args(argv)
    if args.add_tune:
        add_tune(args.add_tune, args.source, args.max_tokens)
    rows = perf_fit.load_rows()
    cases = [perf_fit.case_of(r) for r in rows]
    full = perf_fit.fit(
        cases, source=f"{len(rows)} published and measured rows, {perf_fit.MEASUREMENTS_FILE}", stacks=perf_model.STACKS
    )
    table = perf_fit.leave_one_out(cases, full)
    errors = []
    print(f"{'row':46s} {'quantity':22s} {'measured':>10s} {'fit':>10s} {'LOO':>10s} {'LOO err':>8s}")
    for t in table:
        for key, v in t["observed"].items():
            loo = t["loo"][key]
            errors.append(abs(loo / v - 1))
            print(f"{t['id']:46s} {key:22s} {v:10.2f} {t['fitted'][key]:10.2f} {loo:10.2f} {loo / v - 1:+8.0%}")
    within = sum(e <= 0.20 for e in errors)
    print(
        f"\nleave-one-out: {within}/{len(errors)} within ±20%, "
        f"median |error| {sorted(errors)[len(errors) // 2]:.0%}, max {max(errors):.0%}"
    )
    print("\ntrend with concurrency (leave-one-out predictions):")
    for tr in perf_fit.trends(cases, {t["id"]: t["loo"] for t in table}):
        mark = "ok " if tr["right"] else "NO "
        print(
            f"  {mark} {tr['stack']:12s} {tr['gpu']:6s} {tr['target']:38s} "
            f"c={tr['concurrency'][0]}->{tr['concurrency'][1]}: "
            f"measured {tr['measured']}, predicted {tr['predicted']}"
        )
    print()
    for e in full.stacks:
        print(" ", full.describe(e))
    print(
        "  shared:", {k: round(v, 4) for k, v in full.as_dict()["shared"].items()}, "MoE rows:", full.rows.get("shared")
    )
    if args.json:
        args.json.write_text(json.dumps({"calibration": full.as_dict(), "rows": table}, indent=1))
    if args.write:
        f = perf_model.data_dir() / perf_model.CALIBRATION_FILE
        full.save(f)
        print(f"wrote {f}")
        write_loo(table, rows)


def write_loo(table: list[dict], rows) -> None:
    """The rows' leave-one-out errors, what ``plan`` states its ranges from (``plan.uncertainty``)."""
    from dflash_trt.plan import perf_model, uncertainty

    where = {r.id: (r.gpu, r.concurrency) for r in rows}
    f = perf_model.data_dir() / uncertainty.LOO_FILE
    uncertainty.save(
        uncertainty.errors_of(table, where), f, f"bench/fit_perf_model.py --write: leave-one-out over {len(rows)} rows"
    )
    print(f"wrote {f}")
    return 0


def add_tune(path: Path, source: str, max_tokens: int) -> None:
    """Replace the measurements' CPU rows with the levels of a ``tune --json`` sweep."""
    from dflash_trt.plan import perf_fit, perf_model

    f = perf_model.data_dir() / perf_fit.MEASUREMENTS_FILE
    data = json.loads(f.read_text())
    sweep = json.loads(Path(path).read_text())
    rows = [r for r in data["rows"] if r["stack"] != "reference"]
    for L, levels in sorted(sweep["measured"].items(), key=lambda kv: int(kv[0])):
        for lv in levels:
            L_, c = int(L), lv["concurrency"]
            rate = {"tokens_per_s" if L_ else "baseline_tokens_per_s": lv["tokens_per_second_per_user"]}
            rows.append(
                {
                    "id": f"reference-cpu-tiny-draft{L_}-c{c}",
                    "stack": "reference",
                    "gpu": "cpu",
                    "target": "embedded:tiny/target",
                    "drafter": "embedded:tiny/drafter",
                    "precision": "bf16",
                    "tp": 1,
                    "concurrency": c,
                    "draft_len": L_,
                    "tau": lv["acceptance_length"] if L_ else None,
                    "tau_source": "measured",
                    "context": 64 + max_tokens // 2,
                    "per_user": True,
                    "weight": 1.0,
                    **rate,
                    "source": source,
                    "notes": "decode tokens/s per user (TTFT excluded), embedded server, continuous batching",
                }
            )
    data["rows"] = rows
    f.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{f}: {sum(r['stack'] == 'reference' for r in rows)} CPU rows from {path}")


if __name__ == "__main__":
    raise SystemExit(main())
