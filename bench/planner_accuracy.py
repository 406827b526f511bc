"""The planner's speedup error by source: calibrated model, measured tables, and their combination.

    python bench/planner_accuracy.py                      # table on stdout
    python bench/planner_accuracy.py --write bench/results/2026-12-03-planner-accuracy.json

For every published and measured row with a speedup (``dflash_trt/assets/perf/measurements.json``):

* **calibrated**: today's step model, its leave-one-out error (``dflash_trt/assets/perf/loo.json``:
  the constants refitted without that row);
* **tables**: the target's forward from aiconfigurator-core's measured per-operation tables
  (:mod:`dflash_trt.plan.silicon`) with our drafter and KV injection, and NO fixed per-forward
  cost of our own (the tables' step is all the loop there is);
* **combined**: the tables' target forward plus our drafter, KV injection and a fixed loop cost per
  forward fitted on the rows the tables price, leave-one-out (each row's prediction uses the cost
  fitted without it); the full fit is what ``plan`` uses (``--write-loop``).

Every column predicts what the row measured: an end-to-end row (``prompt_tokens``/``output_tokens``)
with the prefills that stall it (``perf_fit.Case.predict``, the same quantity the calibrated fit uses).
The drafter's constants come from the calibrated model's full fit, not refitted without the row
(the tables themselves were not fitted on these rows): slightly optimistic where they matter.
Rows the tables cannot price (the CPU rows, the Transformers stack, GPUs or models the tables
lack) have no tables/combined figure and say why. Errors are grouped by stack, GPU class and
concurrency band; a trend check says whether each source's predicted curve moves the way the
measured one does as concurrency grows.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BANDS = ((1, 1, "c=1"), (2, 8, "c=2-8"), (9, 32, "c=9-32"), (33, 10**9, "c>32"))


def band(c: int) -> str:
    return next(name for lo, hi, name in BANDS if lo <= c <= hi)


def gpu_class(gpu: str) -> str:
    return {"B200": "Blackwell", "B300": "Blackwell", "GB200": "Blackwell", "H100": "Hopper", "H200": "Hopper"}.get(
        gpu, gpu
    )


GRID = [i * 1e-4 for i in range(0, 81)]  # the combined model's loop cost per forward: 0 .. 8 ms


def predictor(case, cal):
    """``step_s -> speedup`` with the tables' target forward (None, why) where the tables cannot price the row."""
    from dflash_trt.plan import calibrate, perf_fit, silicon, trtllm_releases

    r = case.row
    k = cal.constants(r.stack)
    model_dir = str(perf_fit._config_dir(r.target)) if not r.target.startswith("embedded:") else None
    tables = silicon.silicon_tables(
        model_dir, r.gpu, r.stack, r.precision, r.tp, case.target.layers, trtllm_releases.DEFAULT_RELEASE, r.kv_cache
    )
    if tables is None or tables.reason:
        return None, (tables.reason if tables else "aiconfigurator-core not installed"), None
    tabled = calibrate.TabledCase(**{f: getattr(case, f) for f in case.__dataclass_fields__}, tables=tables)

    def at(step_s: float) -> float:  # what the row measured: with the prefills that stall it, where it has them
        return tabled.predict(replace(k, step_s=step_s), cal.shared)["speedup"]

    return at, None, tables.source


def fit_loop(curves: dict[str, dict[float, float]], measured: dict[str, float], leave: str | None = None) -> float:
    """The loop cost minimising the squared log error of the combined model over the rows (but ``leave``)."""
    import math

    def loss(g: float) -> float:
        return sum(math.log(c[g] / measured[i]) ** 2 for i, c in curves.items() if i != leave)

    return min(GRID, key=loss)


def rows_and_errors() -> list[dict]:
    from dflash_trt.plan import perf_fit, perf_model

    cal = perf_model.shipped_calibration()
    loo = {
        x["id"]: x["error"]
        for x in json.loads((perf_model.data_dir() / "loo.json").read_text())["rows"]
        if x["quantity"] == "speedup"
    }
    rows = [r for r in perf_fit.load_rows() if r.speedup is not None and r.tau is not None and r.draft_len > 0]
    preds = {r.id: predictor(perf_fit.case_of(r), cal) for r in rows}
    curves = {i: {g: at(g) for g in GRID} for i, (at, _, _) in preds.items() if at is not None}
    measured = {r.id: r.speedup for r in rows}
    full = fit_loop(curves, measured) if curves else None
    out = []
    for row in rows:
        at, why, source = preds[row.id]
        tables = combined = None
        if at is not None:  # tables alone: no loop cost of ours; combined: the loop cost fitted without this row
            tables, combined = curves[row.id][0.0], curves[row.id][fit_loop(curves, measured, leave=row.id)]
        err = {
            k: None if v is None else round(v / row.speedup - 1, 4)
            for k, v in (("tables", tables), ("combined", combined))
        }
        out.append(
            {
                "id": row.id,
                "stack": row.stack,
                "gpu": row.gpu,
                "gpu_class": gpu_class(row.gpu),
                "target": row.target,
                "concurrency": row.concurrency,
                "band": band(row.concurrency),
                "measured": row.speedup,
                "calibrated_loo_error": loo.get(row.id),
                "tables": None if tables is None else round(tables, 3),
                "combined": None if combined is None else round(combined, 3),
                "tables_error": err["tables"],
                "combined_error": err["combined"],
                "tables_source": source,
                "tables_missing": why,
            }
        )
    return out, full


def summary(rows: list[dict]) -> list[dict]:
    """Per (stack, GPU class, band): the median |error| and the worst error of each source."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["stack"], r["gpu_class"], r["band"]), []).append(r)
    out = []
    for (stack, cls, b), rs in sorted(groups.items()):
        entry = {"stack": stack, "gpu_class": cls, "band": b, "rows": len(rs)}
        for src, key in (
            ("calibrated", "calibrated_loo_error"),
            ("tables", "tables_error"),
            ("combined", "combined_error"),
        ):
            errs = [r[key] for r in rs if r[key] is not None]
            entry[src] = (
                None
                if not errs
                else {
                    "median_abs": round(sorted(map(abs, errs))[len(errs) // 2], 4),
                    "worst": max(errs, key=abs),
                    "n": len(errs),
                }
            )
        out.append(entry)
    return out


def trends(rows: list[dict]) -> list[dict]:
    """For each model measured at several concurrencies: does each source move as the measurement does?"""
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault((r["stack"], r["gpu"], r["target"]), []).append(r)
    out = []
    for (stack, gpu, target), rs in by.items():
        if len({r["concurrency"] for r in rs}) < 2:
            continue
        lo, hi = min(rs, key=lambda r: r["concurrency"]), max(rs, key=lambda r: r["concurrency"])
        measured = hi["measured"] - lo["measured"]
        entry = {
            "stack": stack,
            "gpu": gpu,
            "target": target,
            "concurrency": [lo["concurrency"], hi["concurrency"]],
            "measured": [lo["measured"], hi["measured"]],
        }
        for src in ("tables", "combined"):
            if lo[src] is not None and hi[src] is not None:
                pred = hi[src] - lo[src]
                entry[src] = {"predicted": [lo[src], hi[src]], "rises_where_measured_falls": measured < 0 < pred}
        out.append(entry)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", type=Path, help="write the dated results JSON here")
    ap.add_argument(
        "--title",
        default="Planner speedup error by source (calibrated, tables, combined)",
        help="the results file's title (docs/reference/performance.md shows it)",
    )
    ap.add_argument(
        "--write-loop",
        action="store_true",
        help="write the fitted loop cost into the package "
        "(dflash_trt/assets/perf/silicon.json), what plan's combined model uses",
    )
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows, loop_s = rows_and_errors()
    seconds = time.perf_counter() - t0
    print(f"combined model's loop cost per forward, fitted on every row the tables price: {(loop_s or 0) * 1e6:.0f} us")
    fmt = lambda e: "    -" if e is None else f"{e:+5.0%}"  # noqa: E731
    print(f"{'row':46s} {'meas':>5s} {'calib LOO':>9s} {'tables':>7s} {'comb':>7s}  tables missing")
    for r in rows:
        print(
            f"{r['id']:46s} {r['measured']:5.2f} {fmt(r['calibrated_loo_error']):>9s} "
            f"{fmt(r['tables_error']):>7s} {fmt(r['combined_error']):>7s}  {r['tables_missing'] or ''}"
        )
    groups, trend = summary(rows), trends(rows)
    print(json.dumps(groups, indent=1))
    if args.write_loop and loop_s is not None:
        from dflash_trt.plan import silicon

        n = sum(r["combined"] is not None for r in rows)
        loo = [
            {
                "id": r["id"],
                "stack": r["stack"],
                "gpu": r["gpu"],
                "concurrency": r["concurrency"],
                "quantity": "speedup",
                "error": r["combined_error"],
            }
            for r in rows
            if r["combined"] is not None
        ]
        silicon.LOOP_FILE.write_text(
            json.dumps(
                {
                    "loop_s": round(loop_s, 6),
                    "rows": n,
                    "source": (
                        f"bench/planner_accuracy.py --write-loop: fitted on the {n} published rows the tables price "
                        f"(aiconfigurator-core {silicon.installed()})"
                    ),
                    "loo": loo,
                },
                indent=1,
            )
            + "\n"
        )
    if args.write:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        from dflash_trt.plan import silicon

        data = {
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "commit": commit,
            "command": " ".join(["python bench/planner_accuracy.py", *(argv or sys.argv[1:])]),
            "title": args.title,
            "results": {
                "aiconfigurator_core": silicon.installed(),
                "seconds": round(seconds, 2),
                "combined_loop_s": loop_s,
                "rows": rows,
                "groups": groups,
                "trends": trend,
            },
        }
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
