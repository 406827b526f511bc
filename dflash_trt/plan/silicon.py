"""Target step costs from NVIDIA's measured per-operation tables (``aiconfigurator-core``), lazily.

Invariant: where the tables cover the GPU, the stack, the model and the precision, the target's
forward at width ``w`` tokens per row and batch ``b`` is the sum of the tables' interpolated
per-operation latencies for that step; everything else (the drafter, the KV injection, the loop's
fixed cost) stays our calibrated model, and a term the tables cannot give falls back to that model
and says so (:attr:`Tables.reason`). Importing this module imports nothing of ``aiconfigurator_core``;
:func:`silicon_tables` loads it (and its tables) on first use.

How a width is asked for without MTP layer scaling (read in ``aiconfigurator_core/sdk``, 0.12.0):
``engine.compile_engine(..., nextn=n)`` sets the verify width of a generation step to ``n + 1``
query tokens per request (the Rust engine's ``num_decode_query_tokens``) AND multiplies every
generation op's count by ``models/helpers.py::mtp_scale_factor(n, L) = (L + n) / L`` (the MTP
layers' extra compute; ``models/llama.py`` applies it to each generation op alike). The compiled
engine's ``decode_step_latency(b, isl, osl)`` is therefore ``(L + n) / L`` x the step at width
``n + 1``; dividing by that factor gives the target's own forward at width ``n + 1``. Measured on
that engine (``tests/plan/test_silicon.py``): the step at width ``w`` over ``b`` rows, the scale
divided out, equals the width-1 step over ``b x w`` rows to the last digit, at every context (the
library prices a verify's ``w`` query tokens per request as ``w`` decode rows). So the target's
forward at any width is priced by ONE width-1 engine: no width is interpolated (a linear
interpolation between compiled widths under-priced a 10-token verify at batch 32 by 3-4%, where
the step's cost in tokens bends). Every op but the generation attention costs what ``b x w``
tokens cost. The attention does not: ``w`` decode rows per request each read the request's whole
K/V cache, where a verify (TensorRT-LLM's and FlashInfer's multi-token generation attention) reads
it once for its ``w`` query tokens. The decode step's only context-dependent op is that attention,
so the verify is priced as ``T1(b x w, S0) + T1(b, S) - T1(b, S0)`` (``T1``: the width-1 step,
``S0`` = :data:`DECODE_ISL_FLOOR`): the ``b x w`` tokens' GEMMs, MoE and communication, plus one
context read per request. The ``w`` queries' attention FLOPs beyond one row's are not added
(a decode-shaped verify stays memory-bound at the contexts a plan uses). The MTP arm's step is
that verify times the MTP layers' ``(L + n) / L``, on the same footing.

Table version: the newest version the tables hold for the stack at or below the targeted
TensorRT-LLM release (``aiconfigurator_core/systems/data/<system>/gemm/<framework>/<version>``);
vLLM and SGLang, whose release a plan does not target, use the tables' current version.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from dflash_trt.plan import silicon_floors
from dflash_trt.plan.model_shapes import TargetShape
from dflash_trt.plan.perf_model import StackConstants, StepModel
from dflash_trt.plan.silicon_floors import table_version_key
from dflash_trt.plan.uncertainty import RowError

logger = logging.getLogger(__name__)

SYSTEMS = {
    "H100": "h100_sxm",
    "H100 PCIe": "h100_pcie",
    "H200": "h200_sxm",
    "B200": "b200_sxm",
    "B300": "b300_sxm",
    "GB200": "gb200",
    "GB300": "gb300",
    "A100 80GB": "a100_sxm",
    "L40S": "l40s",
}
FRAMEWORKS = {"trtllm": "trtllm", "vllm": "vllm", "sglang": "sglang"}
GEMM = {"bf16": "bfloat16", "fp8": "fp8", "nvfp4": "nvfp4"}  # mxfp4 and others: inferred from the config
MAX_VERIFY_WIDTH = 32  # wider forwards are prefills, which the tables' decode engine does not price
LOOP_FILE = Path(__file__).resolve().parents[1] / "assets" / "perf" / "silicon.json"


@lru_cache(maxsize=1)
def loop() -> dict:
    """The combined model's fixed cost per forward beside the tables' step (``loop_s``: scheduling,
    sampling, host sync, launches the tables do not time), fitted by ``bench/planner_accuracy.py``."""
    return json.loads(LOOP_FILE.read_text())


DECODE_ISL_FLOOR = 16


def installed() -> str | None:
    """The installed ``aiconfigurator-core`` version (no import), or None."""
    if importlib.util.find_spec("aiconfigurator_core") is None:
        return None

    try:
        return metadata.version("aiconfigurator-core")
    except metadata.PackageNotFoundError:
        return None


def table_version(system: str, framework: str, release: str | None) -> str | None:
    """The newest GEMM table version for ``system``/``framework`` at or below ``release``
    (None: the newest); None when the tables hold none."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]) / "systems" / "data" / system / "gemm" / framework
    versions = sorted((p.name for p in root.iterdir() if p.is_dir()), key=table_version_key) if root.is_dir() else []
    if release is not None:
        versions = [v for v in versions if table_version_key(v) <= table_version_key(release)]
    return versions[-1] if versions else None


@dataclass
class Tables:
    """The target's step times from the tables for one deployment (ms)."""

    model: str  # the target's config directory or hub id, as the tables read it
    system: str
    framework: str
    version: str | None
    precision: str
    tp: int
    layers: int
    kv_cache: str = "auto"
    reason: str | None = None  # why the tables do not serve this deployment (None: they do)
    _engines: dict = field(default_factory=dict, repr=False)

    @property
    def source(self) -> str:
        return (
            f"aiconfigurator-core {installed()} measured tables ({self.framework} {self.version or 'current'}, "
            f"{self.system})"
        )

    def _engine(self, nextn: int):
        if nextn not in self._engines:
            from aiconfigurator_core.sdk.engine import EngineHandle  # optional: aiconfigurator_core

            # its per-table loading notices are not the plan's to print: the plan names the tables it used
            logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
            kv = "fp8" if self.kv_cache == "fp8" else "bfloat16"
            # MoE experts split like the rest (moe_tp = tp, no expert parallelism): its width check wants
            # tp x attention_dp = moe_tp x moe_ep
            self._engines[nextn] = EngineHandle.compile(
                self.model,
                self.system,
                self.framework,
                backend_version=self.version,
                tp_size=self.tp,
                moe_tp_size=self.tp,
                moe_ep_size=1,
                gemm_quant_mode=GEMM.get(self.precision),
                kvcache_quant_mode=kv,
                fmha_quant_mode="bfloat16",
                nextn=nextn,
            )
        return self._engines[nextn]

    def library_ms(self, b: int, nextn: int, ctx: int) -> float:
        """The library's own MTP step (width nextn + 1, with the MTP layers' (L + n) / L)."""
        return float(self._engine(nextn).decode_step_latency(b, max(DECODE_ISL_FLOOR, ctx), 2))

    def mtp_step_ms(self, b: int, nextn: int, ctx: int) -> float:
        """The MTP arm's step: the verify at width nextn + 1 with the MTP layers' (L + n) / L."""
        return (self.layers + nextn) / self.layers * self.forward_ms(b, nextn + 1, ctx)

    def below(self, target: TargetShape, b: int, width: int, ctx: int) -> str | None:
        """Which size of the forward over ``b`` x ``width`` lies below the smallest the tables
        collected (:mod:`dflash_trt.plan.silicon_floors`; None: none, or the tables do not serve)."""
        if self.reason is not None:
            return None
        kv = "fp8" if self.kv_cache == "fp8" else "bfloat16"
        floor = silicon_floors.floors(self.system, self.framework, self.version, GEMM.get(self.precision), kv)
        return silicon_floors.below(floor, target, self.tp, b, width, max(DECODE_ISL_FLOOR, ctx))

    def _width_ms(self, b: int, width: int, ctx: int) -> float:
        """The library's step at ``width`` over ``b`` rows, its MTP layer scale divided out."""
        n = width - 1
        scale = (self.layers + n) / self.layers if n > 0 else 1.0
        return self.library_ms(b, n, ctx) / scale

    def forward_ms(self, b: int, width: int, ctx: int) -> float:
        """The target's forward over ``b`` rows x ``width`` tokens at decode context ``ctx``: the
        tables' width-1 step over ``b x width`` rows (their width-``width`` step over ``b`` rows
        exactly), with the context read once per row, not once per token (see the
        module docstring)."""
        if width == 1:
            return self._width_ms(b, 1, ctx)
        s0 = DECODE_ISL_FLOOR
        return self._width_ms(b * width, 1, s0) + self._width_ms(b, 1, ctx) - self._width_ms(b, 1, s0)


@lru_cache(maxsize=32)
def _probe(
    model: str, system: str, framework: str, version: str | None, precision: str, tp: int, layers: int, kv_cache: str
) -> Tables:
    t = Tables(model, system, framework, version, precision, tp, layers, kv_cache)
    try:
        t.forward_ms(1, 1, 512)
    except Exception as exc:  # the library refuses what its tables lack (model family, system, version)
        logger.info("aiconfigurator-core cannot price %s on %s/%s: %s", model, system, framework, exc)
        t.reason = f"the tables cannot price it ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
    return t


def silicon_tables(
    model: str | None,
    gpu: str,
    stack: str,
    precision: str,
    tp: int,
    layers: int,
    release: str | None,
    kv_cache: str = "auto",
) -> Tables | None:
    """The tables for a deployment, or None when the library is absent; a :class:`Tables` whose
    ``reason`` says why when they lack the GPU, the stack, the model or the version."""
    if installed() is None:
        return None
    system, framework = SYSTEMS.get(gpu), FRAMEWORKS.get(stack)
    if system is None or framework is None or model is None:
        why = (
            f"the tables hold no {gpu}"
            if system is None
            else f"the tables hold no {stack} stack"
            if framework is None
            else "the target has no config to read"
        )
        return Tables(model or "", system or gpu, framework or stack, None, precision, tp, layers, kv_cache, why)
    version = table_version(system, framework, release if framework == "trtllm" else None)
    if version is None:
        return Tables(
            model,
            system,
            framework,
            None,
            precision,
            tp,
            layers,
            kv_cache,
            f"the tables hold no {framework} data at or below {release} for {system}",
        )
    if framework != "trtllm":
        version = None  # the tables' current slot (a raw version is refused outside the slots)
    return _probe(model, system, framework, version, precision, tp, layers, kv_cache)


@dataclass(frozen=True)
class SiliconStepModel(StepModel):
    """:class:`~dflash_trt.plan.perf_model.StepModel` with the target's forward from the tables
    (the drafter, KV injection and loop stay the calibrated model's); without usable tables it is
    the calibrated model unchanged."""

    tables: Tables | None = field(default=None, compare=False, hash=False)
    # the calibrated model's constants: a step below the tables' smallest collected size is its
    calibrated: StackConstants | None = field(default=None, compare=False, hash=False)

    @property
    def uses_tables(self) -> bool:
        return self.tables is not None and self.tables.reason is None

    def below(self, b: int, n: int) -> str | None:
        """Why the forward over ``b`` x ``n`` lies below the tables' collected sizes (None: it does not)."""
        return self.tables.below(self.target, b, n, self.ctx) if self.uses_tables and self.tables else None

    def _fallback(self, b: int, n: int) -> StepModel | None:
        """The calibrated model for a step whose target forward lies below the tables (None: above)."""
        if self.calibrated is None or n > MAX_VERIFY_WIDTH or self.below(b, n) is None:
            return None
        fields = {f: getattr(self, f) for f in StepModel.__dataclass_fields__}
        return StepModel(**{**fields, "k": self.calibrated})

    def target_forward(self, b: int, n: int) -> float:
        # a prefill (wider than any verify) is not a decode step the tables' decode engine prices
        if not self.uses_tables or n > MAX_VERIFY_WIDTH or self.below(b, n) is not None:
            return super().target_forward(b, n)
        assert self.tables is not None
        return self.tables.forward_ms(b, n, self.ctx) / 1000.0

    def ar_step(self, b: int) -> float:
        m = self._fallback(b, 1)
        return m.ar_step(b) if m is not None else super().ar_step(b)

    def dflash_step(self, b: int, draft_len: int, tau: float) -> float:
        m = self._fallback(b, draft_len + 1) if draft_len > 0 else None
        return m.dflash_step(b, draft_len, tau) if m is not None else super().dflash_step(b, draft_len, tau)


def loo_errors() -> list:
    """The combined model's leave-one-out errors on the rows the tables price (``uncertainty.RowError``):
    what a plan's ranges rest on when it used the tables."""
    return [RowError.from_dict(r) for r in loop().get("loo", [])]


def combined(model: StepModel, tables: Tables | None, refitted: bool = False) -> StepModel:
    """``model`` with the target's forward from ``tables`` and the loop cost fitted beside them
    (:func:`loop`); ``model`` itself where the tables do not serve. ``refitted``: ``model``'s
    constants were refitted over the tables' target step (the user's ``--calibration``,
    :func:`dflash_trt.plan.calibrate.calibration_from_files`) and stay as they are."""
    fields = {f: getattr(model, f) for f in StepModel.__dataclass_fields__}
    if tables is None or tables.reason is not None or refitted:
        return SiliconStepModel(**fields, tables=tables, calibrated=model.k)
    return SiliconStepModel(**{**fields, "k": prior(model.k)}, tables=tables, calibrated=model.k)


def prior(k: StackConstants) -> StackConstants:
    """The combined model's constants: ``k`` (the calibrated stack's) with the loop cost fitted
    beside the tables; where the user's rows start their refit over the tables' target step."""
    return replace(k, step_s=float(loop()["loop_s"]))


def below_note(model: SiliconStepModel, lengths: list[int]) -> str:
    """Where the planned steps (``lengths[b - 1]``: the draft length at batch ``b``) lie below the
    tables' smallest collected sizes, which the calibrated model then prices ("" where none does)."""
    low: dict[int, str] = {}
    for b, n in enumerate(lengths or [0], start=1):
        why = model.below(b, 1) or (model.below(b, n + 1) if n else None)
        if why:
            low[b] = why
    if not low:
        return ""
    at = (
        f"{min(low)}"
        if len(low) == 1
        else f"{min(low)}-{max(low)}"
        if len(low) == max(low) - min(low) + 1
        else ", ".join(map(str, sorted(low)))
    )
    return (
        f"; at batch {at} below the tables' smallest collected size ({low[min(low)]}): "
        "the calibrated model's step there"
    )


def sources(model: StepModel, calibration: str, user: bool, lengths: list[int] | None = None) -> dict[str, str]:
    """Where each term of ``model``'s step comes from (``calibration``: ``Calibration.describe``;
    ``lengths``: the planned draft length at every batch size, to say where a step lies below the tables)."""
    head, sep, _ = calibration.partition("): ")  # "STACK calibration (SOURCE; N rows ...): constants"
    short = head + ")" if sep else calibration  # (a source may hold colons: "your measurements: a.json")
    own = f"user calibration ({short})" if user else f"calibrated model ({short})"
    tables = getattr(model, "tables", None)
    if isinstance(model, SiliconStepModel) and model.uses_tables and tables is not None:
        target = tables.source + below_note(model, lengths or [])
        fit = f"{short}, refitted over the tables' target step" if user else loop()["source"]
        own = f"user calibration ({short}, over the tables' target step)" if user else own
        return {
            "target_forward": target,
            "drafter": own,
            "kv_injection": own,
            "loop": f"{model.k.step_s * 1e6:.0f} us per forward beside the tables ({fit})",
            "mtp_step": target,
        }
    elif tables is not None and tables.reason:
        target = f"{own}; tables fell back: {tables.reason}"
    else:
        target = f"{own}; aiconfigurator-core not installed"
    return {
        "target_forward": target,
        "drafter": own,
        "kv_injection": own,
        "loop": own,
        "mtp_step": target if isinstance(model, SiliconStepModel) and model.uses_tables else own,
    }
