"""The user's own calibration: refit one stack's constants on ``bench --endpoint`` measurements.

``dflash-trt plan --calibration FILE`` (repeatable) reads the JSON that ``dflash-trt bench
--endpoint URL --concurrency ... --json`` writes (``--baseline URL2`` for the same target without
drafting, or two files: one with drafting, one without), turns every level into a measurement of
this deployment (decode tokens/s per user, TTFT excluded, and τ where the server reports it), and
refits the constants of the stack the plan is for, the package's as the prior
(:func:`dflash_trt.plan.perf_fit.fit`). The plan then says which calibration it used.

What a level does not say is assumed from the plan: the draft length the server ran at that
concurrency (what this recipe's bundle drafts, unless the level carries ``draft_len``) and τ where
the server reports none (the plan's τ(L)). The mean measured τ replaces the recipe's estimate
when the recipe sets no ``speculative.acceptance``.

Where aiconfigurator-core's measured tables price the target (:mod:`dflash_trt.plan.silicon`),
the user's rows correct the COMBINED model, not the calibrated one alone: each level is predicted
with the target's forward from the tables (:class:`TabledCase`) and the stack's constants (the
drafter's bandwidth and compute shares, the cost per layer, the loop cost per forward) are refitted
over that step, the combined model's constants as the prior (:func:`silicon.prior`). A user on a
GPU the tables hold keeps the measured-kernel target cost; their own rows correct the rest.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from dflash_trt.errors import DFlashError, read_text
from dflash_trt.plan import hardware, silicon
from dflash_trt.plan.acceptance import expected_tau, fit_alpha
from dflash_trt.plan.memory_model import Deployment, weight_bytes
from dflash_trt.plan.model_shapes import DraftShape, TargetShape
from dflash_trt.plan.perf_fit import CONSTANTS, Case, Row, fit
from dflash_trt.plan.perf_model import Acceptance, Calibration, Shared, StackConstants, StepModel


@dataclass(frozen=True)
class TabledCase(Case):
    """A measured level predicted by the combined model: the target's forward from ``tables``."""

    tables: silicon.Tables | None = field(default=None, compare=False, hash=False)

    def model(self, k: StackConstants, shared: Shared) -> StepModel:
        return silicon.combined(super().model(k, shared), self.tables, refitted=True)


def over_tables(
    cases: list[Case], cal: Calibration, stack: str, tables: silicon.Tables | None
) -> tuple[list[Case], Calibration]:
    """``cases`` and the prior ``cal`` over the tables' target step where ``tables`` serve (the
    combined model: the loop cost beside the tables as the prior's); unchanged where they do not."""
    if tables is None or tables.reason is not None:
        return cases, cal
    start = cal.with_stack(stack, silicon.prior(cal.constants(stack)), cal.source, cal.rows.get(stack, {}))
    return [TabledCase(**{f: getattr(c, f) for f in c.__dataclass_fields__}, tables=tables) for c in cases], start


def read_bench(path: Path) -> dict:
    """A ``dflash-trt bench --endpoint ... --json`` report (or ``tune --json``), checked."""
    f = Path(path)
    try:
        data = json.loads(read_text(f, "--calibration"))
    except json.JSONDecodeError as exc:
        raise DFlashError(f"--calibration {f}: invalid JSON ({exc.msg}, line {exc.lineno})") from None
    except RecursionError:
        raise DFlashError(f"--calibration {f}: JSON nested too deeply") from None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("endpoint"), dict)
        or not isinstance(data["endpoint"].get("levels"), list)
    ):
        raise DFlashError(f"--calibration {f}: not the JSON of 'dflash-trt bench --endpoint URL --json'")
    for key in ("endpoint", "baseline"):
        side = data.get(key)
        levels = side.get("levels") if isinstance(side, dict) else None
        if key == "baseline" and side is None:
            continue
        if not isinstance(levels, list):
            raise DFlashError(f"--calibration {f}: {key}.levels is not a list")
        for i, lv in enumerate(levels):
            why = _bad_level(lv)
            if why:
                raise DFlashError(f"--calibration {f}: {key}.levels[{i}]: {why}")
    return data


# A level's numbers: (key, smallest, largest allowed, integer?); None is "not reported" where allowed.
# Every number has a range, whatever its digit count: a fit over 10**30 users never returns.
_LEVEL_NUMBERS = (
    ("concurrency", 1, 1 << 16, True),
    ("draft_len", 0, 1024, True),
    ("tokens_per_second_per_user", 0, 1e9, False),
    ("acceptance_length", 1, 1025, False),
)


def _bad_level(lv) -> str | None:
    """Why a measured level cannot be fitted (a wrong type, a non-finite or impossible number), or None."""
    if not isinstance(lv, dict):
        return "not an object"
    for key, low, high, integer in _LEVEL_NUMBERS:
        v = lv.get(key)
        if v is None and key != "concurrency":
            continue
        ok = isinstance(v, int) if integer else isinstance(v, (int, float))
        if (
            isinstance(v, bool)
            or not ok
            or not isinstance(v, (int, float))
            or not math.isfinite(v)
            or not low <= v <= high
        ):
            kind = "an integer" if integer else "a finite number"
            return f"{key} is {v!r}; it must be {kind} in [{low:g}, {high:g}]"
    return None


def _drafting(report: dict, key: str) -> bool:
    """The ``endpoint`` of a report with a ``baseline`` drafts; otherwise a side drafts where
    its server reported τ > 1 (a server without drafting reports none)."""
    if key == "endpoint" and "baseline" in report:
        return True
    return any((lv.get("acceptance_length") or 0) > 1 for lv in report[key]["levels"])


def cases_from_bench(
    report: dict,
    *,
    stack: str,
    target: TargetShape,
    drafter: DraftShape,
    gpu: hardware.GPU,
    precision: str,
    kv_cache: str,
    tp: int,
    draft_len_at,
    tau_at,
) -> list[Case]:
    """One case per measured level: decode tokens/s per user (TTFT excluded) with drafting or
    without. ``draft_len_at(c)`` / ``tau_at(L)``: what the server drafts at concurrency ``c`` and
    the τ to assume where the level reports none (a level's own ``draft_len``/τ win)."""
    ctx = 64 + int(report.get("max_tokens") or 128) // 2
    cases = []
    for key in ("endpoint", "baseline"):
        if key not in report:
            continue
        drafts = _drafting(report, key)
        for lv in report[key]["levels"]:
            rate = lv.get("tokens_per_second_per_user")
            c = int(lv.get("concurrency") or 0)
            if not rate or c < 1:
                continue
            L = int(lv.get("draft_len", draft_len_at(c))) if drafts else 0
            tau = (lv.get("acceptance_length") or tau_at(L)) if L else None
            row = Row(
                id=f"{key}-c{c}",
                stack=stack,
                gpu=gpu.name,
                target="(deployment)",
                drafter="(deployment)",
                precision=precision,
                tp=tp,
                concurrency=c,
                draft_len=L,
                tau=tau,
                context=ctx,
                per_user=True,
                kv_cache=kv_cache,
                source=str(report[key].get("url", key)),
                **({"tokens_per_s": rate} if L else {"baseline_tokens_per_s": rate}),
            )
            cases.append(Case(row, target, drafter, gpu, weight_bytes(target, precision)))
    if not cases:
        raise DFlashError(
            "--calibration: no level with tokens/s per user to fit (run bench --endpoint with "
            "--concurrency, with and without drafting)"
        )
    return cases


def refit(cal: Calibration, stack: str, cases: list[Case], source: str) -> Calibration:
    """``cal`` with ``stack``'s constants refitted on ``cases`` (the shipped ones as the prior)."""
    start = Calibration({stack: cal.constants(stack)}, cal.shared)
    mine = fit(cases, start=start, source=source, fit_shared=False)
    return cal.with_stack(stack, mine.constants(stack), source, {k: len(cases) for k in CONSTANTS})


def cases_from_files(paths: list[Path], dep, first, stack: str) -> list[Case]:
    """Every measured level of the ``bench --endpoint --json`` reports ``paths`` as a fitting case
    for deployment ``dep`` first planned as ``first`` (its draft lengths by batch size, its α)."""
    lengths = first.lengths() or [first.max_draft_len]
    acc = Acceptance(alpha=first.alpha)
    cases: list[Case] = []
    for path in paths:
        cases += cases_from_bench(
            read_bench(path),
            stack=stack,
            target=dep.target,
            drafter=dep.drafter,
            gpu=dep.gpu,
            precision=dep.precision,
            kv_cache=dep.kv_cache,
            tp=first.tp,
            draft_len_at=lambda c: lengths[min(c, len(lengths)) - 1],
            tau_at=acc.tau,
        )
    return cases


def calibration_from_files(
    paths: list[Path], dep, first, cal: Calibration, stack: str, tables: silicon.Tables | None = None
) -> tuple[Calibration, float | None]:
    """The calibration refitted on ``paths`` for deployment ``dep`` (first planned as ``first``
    with ``cal``; over the target step of ``tables`` where they serve, :func:`over_tables`), and
    the measured τ scaled to the full block (None: no level reported τ)."""
    names = ", ".join(Path(p).name for p in paths)
    acc = Acceptance(alpha=first.alpha)  # a level whose τ is the prior's own prediction measured none
    cases, start = over_tables(cases_from_files(paths, dep, first, stack), cal, stack, tables)
    where = "" if start is cal else ", over the measured tables' target step"
    new = refit(start, stack, cases, source=f"your measurements: {names}, {len(cases)} levels{where}")
    measured = [
        (c.row.tau, c.row.draft_len)
        for c in cases
        if c.row.draft_len and c.row.tau and c.row.tau != acc.tau(c.row.draft_len)
    ]
    if not measured:
        return new, None
    tau, L = sum(t for t, _ in measured) / len(measured), round(sum(n for _, n in measured) / len(measured))
    return new, round(expected_tau(fit_alpha(tau, L + 1), first.block_size - 1), 3)


def bundle_deployment(root: Path, manifest) -> tuple:
    """(Deployment, tp, Plan) of a built bundle, from its manifest and model configs."""
    if manifest is None or manifest.plan is None or manifest.gpu is None or manifest.precision is None:
        raise DFlashError(f"{root}: the manifest has no plan; rebuild the bundle with 'dflash-trt build'")
    gpu = hardware.get_gpu(manifest.gpu.name)
    dep = Deployment(
        target=TargetShape.from_dir(Path(root) / "target"),
        drafter=DraftShape.from_dir(Path(root) / "drafter"),
        gpu=gpu,
        gpus=manifest.gpu.count,
        precision=manifest.precision.weights,
        kv_cache=manifest.precision.kv_cache,
    )
    return dep, manifest.plan.tp, manifest.plan
