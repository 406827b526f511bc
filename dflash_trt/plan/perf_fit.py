"""Fitting the step model's per-stack constants to measurements, and checking the fit.

A measurement (:class:`Row`) is one published run, or one level of ``dflash-trt bench
--endpoint``: a model pair on a GPU with a stack, at one concurrency and draft length, with
what was measured (speedup, DFlash tokens/s, autoregressive tokens/s, each where known) and τ.
The published rows live in ``dflash_trt/assets/perf/measurements.json``, each with its source.

**What is fitted.** Per stack, the four :class:`~dflash_trt.plan.perf_model.StackConstants`
(bandwidth share, compute share, cost per forward, cost per layer); the rest is shared and
fixed (:class:`~dflash_trt.plan.perf_model.Shared`). Rows are few, so each stack's constant
is a *pooled* value (one per hardware pool: GPUs, or the host CPU) times a stack offset,
and a stack gets its own offset only where its rows can carry it:

=============  =========================================
rows of stack offsets fitted for it
=============  =========================================
>= 8           all four
3 .. 7         cost per forward, cost per layer
1 .. 2         cost per layer
=============  =========================================

(a stack alone in its pool is the pool). Residuals are log ratios (predicted / measured),
weighted by how well the row is known (``weight``); weak priors keep directions the rows
cannot see at the defaults (pooled values toward ``StackConstants()``, offsets toward 0).
:func:`fit` solves it by Levenberg-Marquardt on log / logit parameters; :func:`leave_one_out`
refits without each row and predicts it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np

from dflash_trt import ingest
from dflash_trt.errors import DFlashError
from dflash_trt.plan import hardware
from dflash_trt.plan.memory_model import weight_bytes
from dflash_trt.plan.model_shapes import DraftShape, TargetShape
from dflash_trt.plan.perf_model import Calibration, Shared, StackConstants, StepModel, data_dir

CONSTANTS = ("bandwidth_share", "compute_share", "step_s", "layer_s")
# Shared constants fitted across stacks, and the rows each rests on (see ``Layout.of``).
SHARED_FITTED = ("gemm_tail_rows", "expert_locality", "moe_gemm_efficiency", "dequant_efficiency")
SHARES = ("bandwidth_share", "compute_share", "expert_locality", "moe_gemm_efficiency", "dequant_efficiency")
PRIOR_POOLED, PRIOR_OFFSET = 0.1, 0.3  # prior weights (per parameter, in log / logit units)
MEASUREMENTS_FILE = "measurements.json"


@dataclass(frozen=True)
class Row:
    """One measurement. Tokens/s are aggregate over the batch unless ``per_user``."""

    id: str
    stack: str
    gpu: str
    target: str  # recipes/configs/<dir>, or embedded:NAME
    # drafter: the same
    drafter: str
    precision: str
    tp: int
    concurrency: int
    draft_len: int
    tau: float | None = None
    tau_source: str = "measured"  # measured | borrowed | assumed
    context: int = 512
    speedup: float | None = None
    tokens_per_s: float | None = None
    baseline_tokens_per_s: float | None = None
    per_user: bool = False
    # End-to-end throughput (prefill included): each request's prefill of ``prompt_tokens`` stalls
    # the batch, ``concurrency`` prefills per request lifetime of ``output_tokens`` decoded tokens.
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    weight: float = 1.0
    kv_cache: str = "auto"
    source: str = ""
    notes: str = ""


@dataclass(frozen=True)
class Case:
    """A row with the shapes its prediction needs."""

    row: Row
    target: TargetShape
    drafter: DraftShape
    gpu: hardware.GPU
    weights_bytes: int

    def model(self, k: StackConstants, shared: Shared) -> StepModel:
        r = self.row
        return StepModel(
            self.target, self.drafter, self.gpu, r.precision, r.kv_cache, r.tp, r.context, k, self.weights_bytes, shared
        )

    def predict(self, k: StackConstants, shared: Shared) -> dict[str, float]:
        """What the model says for what this row measured."""
        r, m = self.row, self.model(k, shared)
        scale = 1 if r.per_user else r.concurrency
        ar = scale * self._end_to_end(m, m.ar_step(r.concurrency))
        out = {"baseline_tokens_per_s": ar}
        if r.tau is not None and r.draft_len > 0:
            df = scale * self._end_to_end(m, m.dflash_step(r.concurrency, r.draft_len, r.tau) / r.tau)
            out.update(tokens_per_s=df, speedup=df / ar)
        return out

    def _end_to_end(self, m: StepModel, per_token_s: float) -> float:
        """Tokens/s one request sees: decode, plus the prefills that stall it (see ``prompt_tokens``)."""
        r = self.row
        if not (r.prompt_tokens and r.output_tokens):
            return 1.0 / per_token_s
        stall = r.concurrency * (m.k.step_s + m.target_forward(1, r.prompt_tokens))
        return r.output_tokens / (r.output_tokens * per_token_s + stall)

    def observed(self) -> dict[str, float]:
        r = self.row
        return {
            key: getattr(r, key)
            for key in ("speedup", "tokens_per_s", "baseline_tokens_per_s")
            if getattr(r, key) is not None
        }


# --- the data ---------------------------------------------------------------------------


def _config_dir(ref: str) -> Path:
    if ref.startswith(ingest.EMBEDDED_PREFIX):
        return ingest.resolve(ref)

    path = Path(str(resources.files("dflash_trt") / "recipes" / "configs" / ref))
    if not (path / "config.json").is_file():
        raise DFlashError(f"measurement model {ref!r}: no recipes/configs/{ref}/config.json")
    return path


@cache
def _shapes(target: str, drafter: str) -> tuple[TargetShape, DraftShape]:
    t = TargetShape.from_dir(_config_dir(target))
    d = DraftShape.from_dir(_config_dir(drafter))
    if "head_dim" not in json.loads((_config_dir(drafter) / "config.json").read_text()):
        d = replace(d, head_dim=t.head_dim)  # partial drafter configs: DFlash shares the target's heads
    return t, d


def case_of(row: Row) -> Case:
    t, d = _shapes(row.target, row.drafter)
    return Case(row, t, d, hardware.get_gpu(row.gpu), weight_bytes(t, row.precision))


def row_from_dict(r: dict) -> Row:
    """One measurement row (its serving software under ``stack``)."""
    return Row(**r)


def load_rows(path: Path | None = None) -> list[Row]:
    """The published measurements (``assets/perf/measurements.json``)."""
    f = Path(path) if path else data_dir() / MEASUREMENTS_FILE
    try:
        data = json.loads(f.read_text())
        return [row_from_dict(r) for r in data["rows"]]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise DFlashError(f"{f}: cannot read measurements ({exc})") from None


# --- the fit ----------------------------------------------------------------------------


def _owned(n_rows: int) -> tuple[str, ...]:
    if n_rows >= 8:
        return CONSTANTS
    if n_rows >= 3:
        return ("step_s", "layer_s")
    return ("layer_s",) if n_rows >= 1 else ()


def _to_param(name: str, value: float) -> float:
    return math.log(value / (1 - value)) if name in SHARES else math.log(value)


def _from_param(name: str, x: float) -> float:
    return 1 / (1 + math.exp(-x)) if name in SHARES else math.exp(x)


def pool_of(gpu: str) -> str:
    return "cpu" if hardware.get_gpu(gpu).kind == "cpu" else "gpu"


@dataclass
class Layout:
    """Which parameters exist, in this order: pooled ones per (pool, constant), offsets per
    (stack, constant), then the shared constants the MoE rows fit (where there are >= 2)."""

    pooled: list[tuple[str, str]]
    offsets: list[tuple[str, str]]
    shared: list[str]
    stack_pool: dict[str, str]
    rows: dict[str, dict[str, int]] = field(default_factory=dict)  # stack -> constant -> rows it rests on

    @classmethod
    def of(cls, cases: list[Case], stacks: tuple[str, ...] = ()) -> Layout:
        count: dict[str, int] = {}
        stack_pool: dict[str, str] = {}
        for c in cases:
            count[c.row.stack] = count.get(c.row.stack, 0) + 1
            stack_pool[c.row.stack] = pool_of(c.row.gpu)
        for e in stacks:
            stack_pool.setdefault(e, "cpu" if e == "reference" else "gpu")
        pooled = [(p, k) for p in sorted(set(stack_pool.values())) for k in CONSTANTS]
        offsets, rows = [], {}
        for e, p in sorted(stack_pool.items()):
            alone = sum(1 for f, q in stack_pool.items() if q == p and count.get(f, 0)) <= 1
            own = () if alone else _owned(count.get(e, 0))  # alone in its pool: the pool is the stack
            offsets += [(e, k) for k in own]
            in_pool = sum(n for f, n in count.items() if stack_pool[f] == p)
            rows[e] = {k: (count.get(e, 0) if k in own else in_pool) for k in CONSTANTS}
        informed = {
            "gemm_tail_rows": sum(1 for c in cases if pool_of(c.row.gpu) == "gpu"),
            "expert_locality": sum(1 for c in cases if c.target.experts),
            "moe_gemm_efficiency": sum(1 for c in cases if c.target.experts),
            "dequant_efficiency": sum(
                1 for c in cases if c.model(StackConstants(), Shared())._dequantizes(c.row.precision)
            ),
        }
        shared = [k for k in SHARED_FITTED if informed[k] >= 2]
        rows["shared"] = {k: (informed[k] if k in shared else 0) for k in SHARED_FITTED}
        return cls(pooled, offsets, shared, stack_pool, rows)

    def constants(self, x: np.ndarray, stack: str) -> StackConstants:
        pool = self.stack_pool[stack]
        values = {}
        for k in CONSTANTS:
            theta = x[self.pooled.index((pool, k))]
            if (stack, k) in self.offsets:
                theta += x[len(self.pooled) + self.offsets.index((stack, k))]
            values[k] = _from_param(k, theta)
        return StackConstants(**values)

    def shared_of(self, x: np.ndarray, base: Shared) -> Shared:
        first = len(self.pooled) + len(self.offsets)
        return replace(base, **{k: _from_param(k, x[first + i]) for i, k in enumerate(self.shared)})

    def start(self, prior: dict[str, StackConstants], base: Shared) -> np.ndarray:
        return np.array(
            [_to_param(k, getattr(prior[p], k)) for p, k in self.pooled]
            + [0.0] * len(self.offsets)
            + [_to_param(k, getattr(base, k)) for k in self.shared]
        )


def _residuals(
    x: np.ndarray,
    layout: Layout,
    cases: list[Case],
    base: Shared,
    prior: dict[str, StackConstants],
    prior_weight: float,
) -> np.ndarray:
    out = []
    shared = layout.shared_of(x, base)
    for c in cases:
        pred, obs = c.predict(layout.constants(x, c.row.stack), shared), c.observed()
        out += [c.row.weight * math.log(pred[key] / v) for key, v in obs.items() if key in pred]
    x0 = layout.start(prior, base)
    n_pooled, n_offsets = len(layout.pooled), len(layout.offsets)
    out += list(prior_weight * (x[:n_pooled] - x0[:n_pooled]))
    out += list(PRIOR_OFFSET * x[n_pooled : n_pooled + n_offsets])
    out += list(prior_weight * (x[n_pooled + n_offsets :] - x0[n_pooled + n_offsets :]))
    return np.asarray(out)


def _levenberg_marquardt(fun, x0: np.ndarray, iters: int = 60) -> np.ndarray:
    """Minimise ||fun(x)||^2 (numeric Jacobian; a handful of parameters)."""
    x, r = x0.copy(), fun(x0)
    cost, lam = float(r @ r), 1e-2
    for _ in range(iters):
        J = np.empty((r.size, x.size))
        for j in range(x.size):
            step = np.zeros_like(x)
            step[j] = 1e-6
            J[:, j] = (fun(x + step) - r) / 1e-6
        A, g = J.T @ J, J.T @ r
        improved = False
        while lam < 1e10:
            dx = np.linalg.solve(A + lam * (np.diag(np.diag(A)) + 1e-9 * np.eye(x.size)), -g)
            rn = fun(x + dx)
            cn = float(rn @ rn)
            if cn < cost:
                done = cost - cn < 1e-12 * (1 + cost)
                x, r, cost, lam, improved = x + dx, rn, cn, max(lam / 3, 1e-9), True
                break
            lam *= 4
        if not improved or done:
            break
    return x


def fit(
    cases: list[Case],
    *,
    start: Calibration | None = None,
    source: str = "fit",
    stacks: tuple[str, ...] = (),
    prior_weight: float = PRIOR_POOLED,
    fit_shared: bool = True,
) -> Calibration:
    """Constants per stack from ``cases`` (see the module docstring). ``start`` gives the prior
    and the first guess (default: ``StackConstants()``); ``stacks`` adds stacks without rows
    (they get their pool's values); ``fit_shared=False`` keeps ``start``'s shared constants."""
    start = start or Calibration({})
    layout = Layout.of(cases, tuple(stacks) + tuple(start.stacks))
    if not fit_shared:
        layout.shared = []
    prior = {p: _pool_prior(start, layout, p) for p in {p for p, _ in layout.pooled}}
    x = _levenberg_marquardt(
        lambda v: _residuals(v, layout, cases, start.shared, prior, prior_weight), layout.start(prior, start.shared)
    )
    consts = {e: layout.constants(x, e) for e in layout.stack_pool}
    return Calibration(consts, layout.shared_of(x, start.shared), source, layout.rows)


def _pool_prior(start: Calibration, layout: Layout, pool: str) -> StackConstants:
    """The first guess of a pool: the geometric mean of its stacks' starting constants."""
    mine = [start.stacks[e] for e, p in layout.stack_pool.items() if p == pool and e in start.stacks]
    if not mine:
        return StackConstants() if pool == "gpu" else StackConstants(0.5, 0.3, 1e-3, 1e-4)
    vals = {k: _from_param(k, sum(_to_param(k, getattr(m, k)) for m in mine) / len(mine)) for k in CONSTANTS}
    return StackConstants(**vals)


def leave_one_out(cases: list[Case], full: Calibration, start: Calibration | None = None) -> list[dict]:
    """Per row: measured, predicted by the full fit, and predicted by a fit without the row
    (from the same ``start`` as the full fit, so the row left out informs nothing)."""
    out = []
    for i, c in enumerate(cases):
        rest = cases[:i] + cases[i + 1 :]
        loo = fit(rest, start=start, source="loo", stacks=tuple(full.stacks))
        out.append(
            {
                "id": c.row.id,
                "stack": c.row.stack,
                "observed": c.observed(),
                "fitted": c.predict(full.constants(c.row.stack), full.shared),
                "loo": c.predict(loo.constants(c.row.stack), loo.shared),
            }
        )
    return out


def trends(cases: list[Case], predicted: dict[str, dict[str, float]], flat: float = 0.05) -> list[dict]:
    """Per model and setup with several concurrencies: does the predicted speedup move the way
    the measured one does from the lowest to the highest concurrency (within ``flat``: flat)?"""
    groups: dict[tuple, list[Case]] = {}
    for c in cases:
        r = c.row
        if r.speedup is not None:
            groups.setdefault((r.stack, r.gpu, r.target, r.tp, r.precision), []).append(c)

    def way(first: float, last: float) -> str:
        change = last / first - 1
        return "flat" if abs(change) < flat else ("falls" if change < 0 else "rises")

    out = []
    for key, members in groups.items():
        if len({m.row.concurrency for m in members}) < 2:
            continue
        lo = min(members, key=lambda m: m.row.concurrency)
        hi = max(members, key=lambda m: m.row.concurrency)
        measured = way(lo.row.speedup or 0.0, hi.row.speedup or 0.0)  # not None: grouped above
        model = way(predicted[lo.row.id]["speedup"], predicted[hi.row.id]["speedup"])
        out.append(
            {
                "stack": key[0],
                "gpu": key[1],
                "target": key[2],
                "concurrency": (lo.row.concurrency, hi.row.concurrency),
                "measured": measured,
                "predicted": model,
                "right": measured == model,
            }
        )
    return out
