"""Leave-one-out errors of the user's own rows (``plan --calibration``): what narrows the plan's
ranges (:mod:`dflash_trt.plan.uncertainty`). Each level of the user's ``bench --endpoint`` reports
is predicted by the stack's constants refitted on the OTHER levels (:func:`calibrate.refit`, the
package's constants as the prior), the same way :func:`perf_fit.leave_one_out` treats the
published rows."""

from __future__ import annotations

from pathlib import Path

from dflash_trt.plan.calibrate import cases_from_files, over_tables, refit
from dflash_trt.plan.uncertainty import RowError


def from_cases(cases: list, cal, stack: str) -> list[RowError]:
    """Leave-one-out errors of the user's own rows (``calibrate.cases_from_bench``): each
    predicted by ``stack``'s constants refitted on the others, ``cal`` as the prior. Where a
    concurrency has both a drafting and an autoregressive level, the error is the speedup's,
    ``(1 + e_dflash) / (1 + e_ar) - 1``; else the one level's tokens/s error."""
    if len(cases) < 2:
        return []
    per_c: dict[int, dict[str, float]] = {}
    gpu = cases[0].row.gpu
    for i, c in enumerate(cases):
        loo = refit(cal, stack, cases[:i] + cases[i + 1 :], source="loo")
        pred = c.predict(loo.constants(stack), loo.shared)
        for key, v in c.observed().items():
            if key in pred and v:
                per_c.setdefault(c.row.concurrency, {})[key] = pred[key] / v - 1
    out = []
    for conc, errs in sorted(per_c.items()):
        if "tokens_per_s" in errs and "baseline_tokens_per_s" in errs:
            errs = {"speedup": (1 + errs["tokens_per_s"]) / (1 + errs["baseline_tokens_per_s"]) - 1}
        out += [RowError(f"yours-c{conc}-{k}", stack, gpu, conc, k, round(e, 4)) for k, e in errs.items()]
    return out


def calibration_errors(paths: list[Path], dep, first, cal, stack: str, tables=None) -> list[RowError]:
    """Leave-one-out errors of the levels in ``paths`` (``bench --endpoint --json`` reports, what
    ``plan --calibration`` reads), for deployment ``dep`` first planned as ``first`` (over the
    target step of ``tables`` where they serve, as :func:`calibrate.calibration_from_files` refits)."""
    cases, start = over_tables(cases_from_files(paths, dep, first, stack), cal, stack, tables)
    return from_cases(cases, start, stack)
