"""How far to trust a predicted speedup: a range from the step model's leave-one-out errors.

Every calibration row was predicted once by a fit WITHOUT it (:func:`perf_fit.leave_one_out`);
its error ``e = predicted / measured - 1`` is what a new deployment like it should expect. A
prediction ``s`` at concurrency ``c`` then carries the range::

    [s / (1 + max(e, 0)), s / (1 + min(e, 0))]     over the comparable rows' e

(measured = predicted / (1 + e); the 0 keeps the prediction inside its own range). *Comparable*
rows are taken from the first tier that has at least :data:`MIN_ROWS` rows:

1. the same stack, GPU class (``GPU.arch``: Blackwell, Hopper, ..., CPU) and concurrency band
   (:func:`band`: 1, 2-8, 9-32, 33+);
2. the same stack and GPU class, any concurrency;
3. the same GPU class, any stack;
4. the same hardware pool (GPUs, or the host CPU);
5. every row.

The published rows' errors ship in ``assets/perf/loo.json`` (``bench/fit_perf_model.py --write``
refits 44 times to write them: far too slow for ``plan``). Your own rows (``plan --calibration``,
``verify``'s measurement rows) replace them: each is predicted by the stack's constants refitted
on your OTHER rows (:mod:`calibrate_loo`), and they are the same stack and GPU by construction, so
a few of them narrow the range to what this deployment has shown.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from dflash_trt.errors import DFlashError
from dflash_trt.plan import hardware
from dflash_trt.plan.perf_model import data_dir

LOO_FILE = "loo.json"
MIN_ROWS = 2
BANDS = ((1, 1), (2, 8), (9, 32), (33, 1 << 30))


def band(concurrency: int) -> int:
    """Index into :data:`BANDS` (1 | 2-8 | 9-32 | 33+)."""
    return next(i for i, (lo, hi) in enumerate(BANDS) if lo <= concurrency <= hi)


def band_label(i: int) -> str:
    lo, hi = BANDS[i]
    return f"c{lo}" if lo == hi else (f"c{lo}+" if hi >= 1 << 30 else f"c{lo}-{hi}")


def gpu_class(gpu: str) -> str:
    return hardware.get_gpu(gpu).arch


@dataclass(frozen=True)
class RowError:
    """One row's leave-one-out error on one quantity (``error`` = predicted / measured - 1)."""

    id: str
    stack: str
    gpu: str
    concurrency: int
    quantity: str
    error: float

    @classmethod
    def from_dict(cls, d: dict) -> RowError:
        return cls(
            str(d["id"]), str(d["stack"]), str(d["gpu"]), int(d["concurrency"]), str(d["quantity"]), float(d["error"])
        )


@dataclass(frozen=True)
class Range:
    """A predicted speedup's range and what it rests on."""

    low: float
    high: float
    rows: int
    basis: str  # e.g. "trtllm Blackwell c2-8, 3 rows" or "your measurements, c1, 2 rows"

    def as_dict(self) -> dict:
        return asdict(self)


def errors_of(table: list[dict], stacks: dict[str, tuple[str, int]]) -> list[RowError]:
    """``RowError``s from :func:`perf_fit.leave_one_out`'s table; ``stacks[id]`` = (gpu, concurrency)."""
    out = []
    for t in table:
        gpu, c = stacks[t["id"]]
        for key, v in t["observed"].items():
            if key in t["loo"] and v:
                out.append(RowError(t["id"], t.get("stack", ""), gpu, c, key, round(t["loo"][key] / v - 1, 4)))
    return out


def save(errors: list[RowError], path: Path, source: str) -> None:
    Path(path).write_text(json.dumps({"source": source, "rows": [asdict(e) for e in errors]}, indent=1) + "\n")


def shipped_errors() -> list[RowError]:
    """The published rows' leave-one-out errors (``assets/perf/loo.json``; none when absent)."""
    f = data_dir() / LOO_FILE
    if not f.is_file():
        return []
    try:
        return [RowError.from_dict(r) for r in json.loads(f.read_text())["rows"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise DFlashError(f"{f}: not a dflash-trt leave-one-out table ({exc})") from None


def comparable(errors: list[RowError], stack: str, gpu: str, concurrency: int) -> tuple[list[RowError], str]:
    """The rows a prediction for (stack, gpu, concurrency) is judged by, and a label for them."""
    cls, b = gpu_class(gpu), band(concurrency)
    pool = "CPU" if cls == "CPU" else "GPU"
    tiers = (
        (
            lambda e: e.stack == stack and gpu_class(e.gpu) == cls and band(e.concurrency) == b,
            f"{stack} {cls} {band_label(b)}",
        ),
        (lambda e: e.stack == stack and gpu_class(e.gpu) == cls, f"{stack} {cls}"),
        (lambda e: gpu_class(e.gpu) == cls, f"all stacks {cls}"),
        (lambda e: (gpu_class(e.gpu) == "CPU") == (pool == "CPU"), f"all stacks, {pool}s"),
        (lambda e: True, "all rows"),
    )
    for keep, label in tiers:
        rows = [e for e in errors if keep(e)]
        if len(rows) >= MIN_ROWS:
            return rows, label
    return list(errors), "all rows"


def speedup_range(
    speedup: float, errors: list[RowError], stack: str, gpu: str, concurrency: int, own: bool = False
) -> Range:
    """The range of ``speedup`` predicted for (stack, gpu, concurrency) (module docstring);
    ``own``: ``errors`` are the user's rows of this very deployment (the band alone is matched)."""
    if own:
        rows = [e for e in errors if band(e.concurrency) == band(concurrency)]
        label = f"your measurements {band_label(band(concurrency))}"
        if len(rows) < MIN_ROWS:
            rows, label = list(errors), "your measurements"
    else:
        rows, label = comparable(errors, stack, gpu, concurrency)
    if not rows:
        return Range(round(speedup, 3), round(speedup, 3), 0, "no calibration rows")
    hi_e, lo_e = max(max(e.error for e in rows), 0.0), min(min(e.error for e in rows), 0.0)
    return Range(
        round(speedup / (1 + hi_e), 3), round(speedup / (1 + lo_e), 3), len(rows), f"{label}, {len(rows)} rows"
    )
