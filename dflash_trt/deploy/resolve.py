"""Stage 1 of the build, and the plan: a recipe resolved to its pair, and planned.

:func:`resolve_recipe` applies the GPU and precision rules (refused before any work), finds the
model directories (a recipe's shipped configs where they hold every field the planner needs,
else the hub's or the local cache's at the pinned revision; offline with nothing cached, a
recipe whose configs lack fields is refused in one line), reads the pair once
(``ingest.read_pair``: the :class:`~dflash_trt.ingest.PairSpec` every later stage takes) and
sizes it for the planner. :func:`plan_resolved` plans it (``plan.make_plan``), refitted on the
user's measurements first where given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dflash_trt import ingest
from dflash_trt import plan as planner
from dflash_trt.deploy import trtllm_installed
from dflash_trt.errors import CheckpointError, CompatibilityError, DFlashError, RecipeError
from dflash_trt.plan import GPU, DraftShape, Recipe, TargetShape, quant_precision, read_sizes


@dataclass
class Resolved:
    recipe: Recipe
    gpu: GPU
    gpus: int
    precision: str  # effective: bf16 | fp8 | nvfp4 | mxfp4
    quantize: bool  # True: ModelOpt runs at build time
    pair: ingest.PairSpec  # the pair as ingest read it, once: every later stage takes it
    target: TargetShape
    drafter: DraftShape
    shipped_quant: dict | None
    warnings: list[str] = field(default_factory=list)
    mtp_layers: int = 0  # MTP layers the target's config declares: build also writes the MTP arm

    @property
    def target_dir(self) -> Path:
        """The config (dry run) or checkpoint directory the target was read from."""
        return self.pair.target_dir

    @property
    def drafter_dir(self) -> Path:
        return self.pair.drafter_dir

    @property
    def drafter_config(self):
        """The DrafterConfig (its family's TensorRT-LLM rules read it)."""
        return self.pair.drafter.config


def _ref_dir(recipe: Recipe, role: str, weights: bool) -> Path:
    """The directory ``role`` is read from: for planning, the recipe's shipped configs where they
    hold every field the planner needs, else the hub's (or the local cache's) configs at the
    pinned revision; with ``weights``, the checkpoint itself."""
    ref = getattr(recipe, role)
    lacking = planner.lacking(recipe, role)
    if not weights and ref.config and not lacking:
        path = recipe.resolve_path(ref.config)
        if not (path / "config.json").exists():
            raise DFlashError(f"{role}.config {path}: no config.json there")
        return path
    kwargs = {"revision": ref.revision} if ref.revision else {}
    try:
        local = Path(ref.id).is_absolute() or ref.id.startswith(ingest.EMBEDDED_PREFIX)  # anchored by the recipe
        return ingest.resolve(
            ref.id,
            role,
            expected_bytes=_expected_bytes(recipe, ref),
            configs_only=not weights,
            hub_only=not local,
            **kwargs,
        )
    except CheckpointError as exc:
        if weights or not lacking:
            raise
        raise RecipeError(_offline_refusal(recipe, role, lacking)) from exc


def local_checkpoint(recipe: Recipe, role: str) -> bool:
    """Whether ``role``'s checkpoint is local (a directory, the embedded pair) and planning reads
    that checkpoint itself (no shipped config directory stands in for it)."""
    ref = getattr(recipe, role)
    anchored = Path(ref.id).is_absolute() or ref.id.startswith(ingest.EMBEDDED_PREFIX)
    return anchored and not (ref.config and not planner.lacking(recipe, role))


def _offline_refusal(recipe: Recipe, role: str, lacking: list[str]) -> str:
    """The one line an offline ``plan`` gives for a recipe whose shipped configs lack fields and
    whose hub files are not cached: what is missing (both models'), and the commands that work."""
    ref = getattr(recipe, role)
    at = f"@{ref.revision}" if ref.revision else ""
    roles = [r for r in ("target", "drafter") if r == role or planner.lacking(recipe, r)]
    fields = [f for r in roles for f in (lacking if r == role else planner.lacking(recipe, r))]
    fetch = " and ".join(
        f"`hf download {getattr(recipe, r).id}"
        + (f" --revision {getattr(recipe, r).revision}" if getattr(recipe, r).revision else "")
        + " --include '*.json'`"
        for r in roles
    )
    return (
        f"recipe {recipe.name}: its shipped configs lack {', '.join(fields)} and {role} {ref.id}{at} is not "
        f"in the Hugging Face cache (and the hub is offline or unreachable); fetch the configs with {fetch} "
        "(or run with hub access), or pass --target DIR --drafter DIR"
    )


def _expected_bytes(recipe: Recipe, ref) -> int | None:
    """The checkpoint's size from the recipe's sizes.json (for the free-disk check), if known."""
    path = recipe.resolve_path(ref.config) if ref.config else None
    sizes = read_sizes(path) if path is not None and path.is_dir() else None
    return (sizes or {}).get("total_size") or (sizes or {}).get("bytes")


def resolve_recipe(recipe: Recipe, weights: bool = False) -> Resolved:
    """Everything the plan needs, from configs; ``weights=True`` resolves the checkpoints."""
    gpu = planner.get_gpu(recipe.gpu.name)
    gpus = recipe.gpu.count * recipe.gpu.nodes
    requested, kv = recipe.precision.weights, recipe.precision.kv_cache
    if requested != "auto":
        planner.check_precision(gpu, requested, kv)
    elif kv == "fp8":
        planner.check_precision(gpu, "bf16", kv)
    by_name = ingest.refused_id(recipe.drafter.id)  # a GGUF-only or refused-format hub drafter, by name
    if by_name:
        raise CheckpointError(by_name)
    unpinned = planner.unpinned_drafter(recipe)
    tdir, ddir = _ref_dir(recipe, "target", weights), _ref_dir(recipe, "drafter", weights)
    pair = ingest.read_pair(tdir, ddir, require_weights=weights, enable_thinking=recipe.serving.enable_thinking)
    shipped_q = pair.quantization
    shipped = quant_precision(shipped_q) if shipped_q else None
    if shipped_q and shipped is None:
        raise CompatibilityError(
            f"target {recipe.target.id}: quantization "
            f"{shipped_q.get('quant_method') or shipped_q} "
            "is not one TensorRT-LLM's DFlash path is planned for (fp8, nvfp4, mxfp4)"
        )
    if shipped and requested not in ("auto", shipped):
        raise CompatibilityError(
            f"target {recipe.target.id} is already {shipped}-quantized; it cannot be built at "
            f"{requested}: use --precision auto (or {shipped}), or start from the BF16 checkpoint"
        )
    precision = shipped or ("bf16" if requested == "auto" else requested)
    planner.check_precision(gpu, precision, kv)
    warnings = pair.warnings + ([unpinned] if unpinned else [])
    chat = ingest.chat_mismatch(pair.trained_chat, pair.serving_chat)
    if chat:
        warnings.append(chat)
    dcfg = pair.drafter.config
    ignored = planner.ignored_drafter_keys(dcfg)
    if ignored:
        warnings.append(ignored)
    planner.check_drafter(dcfg, recipe.trtllm.release)
    planner.refuse_quantized_drafter(pair.drafter_quantization, f"drafter {recipe.drafter.id}")
    return Resolved(
        recipe=recipe,
        gpu=gpu,
        gpus=gpus,
        precision=precision,
        quantize=shipped is None and precision in ("fp8", "nvfp4"),
        pair=pair,
        target=TargetShape.from_spec(pair.target, shipped_precision=shipped),
        drafter=DraftShape.from_spec(pair.drafter),
        shipped_quant=shipped_q,
        warnings=warnings,
        mtp_layers=planner.mtp_layers(pair.target.raw_config),
    )


def refuse_trtllm_only(r: Resolved) -> None:
    """A bundle for TensorRT-LLM alone (no ``graphs``) of a target the recipe's TensorRT-LLM release
    cannot capture hidden states from (``plan.trtllm_capture``), in one line naming the runtimes
    that still run the pair."""
    if r.recipe.graphs:
        return
    causal = ingest.trtllm_refusal(r.drafter_config.causal)
    if causal:
        raise CompatibilityError(f"drafter {r.recipe.drafter.id}: {causal}")
    spec = r.pair.target
    why = planner.capture_missing(spec.architecture, r.recipe.trtllm.release)
    if why:
        raise CompatibilityError(
            f"target {r.recipe.target.id}: TensorRT-LLM {r.recipe.trtllm.release}'s {spec.architecture} has no "
            f"hidden-state capture hook ({why}), so DFlash cannot run there; build with --graphs, or serve the "
            "pair with the reference runtime (dflash-trt generate / bench / serve)"
        )


def plan_resolved(r: Resolved, calibration: list[Path] | None = None, stack: str | None = None) -> planner.Plan:
    """The plan; with ``calibration`` (``bench --endpoint --json`` files) the step model's constants
    are first refitted on those measurements (:mod:`dflash_trt.plan.calibrate`); ``stack``: the
    serving stack to predict for (default the recipe's server: TensorRT-LLM on a GPU). The target's
    forward comes from aiconfigurator-core's measured tables where installed and covering
    (:mod:`dflash_trt.plan.silicon`); ``calibration`` then corrects the rest of the combined
    model (drafter, per-layer and loop costs refitted over the tables' target step)."""
    rc = r.recipe
    dep = planner.Deployment(
        target=r.target,
        drafter=r.drafter,
        gpu=r.gpu,
        gpus=r.gpus,
        precision=r.precision,
        kv_cache=rc.precision.kv_cache,
        mtp_layers=r.mtp_layers,
    )
    installed: list[str] = []  # features the installed release has by field and the table lacks
    row = trtllm_installed.release_row(rc.trtllm.release, installed)
    # non-causal windowed drafter layers rule out the TRTLLM draft attention
    backend = planner.drafter_attention_backend(rc.speculative.attention_backend, r.drafter_config, r.gpu.sm, row)
    spec = rc.speculative.model_copy(update={"attention_backend": backend})
    stack = stack or planner.stack_for(r.gpu)
    model = str(r.target_dir) if r.target_dir else None

    def tables(tp: int):
        return planner.silicon_tables(
            model, r.gpu.name, stack, r.precision, tp, r.target.layers, rc.trtllm.release, rc.precision.kv_cache
        )

    on_gpu = None if r.gpu.kind == "cpu" else tables
    p = planner.make_plan(dep, rc.serving, spec, rc.parallel, rc.trtllm, release=row, stack=stack, tables=on_gpu)
    if calibration:  # the user's rows correct the combined model: refitted over the tables' target step
        on = None if on_gpu is None else tables(p.tp)
        cal, tau = planner.calibration_from_files(list(calibration), dep, p, planner.shipped_calibration(), stack, on)
        if tau is not None and spec.acceptance is None:
            spec = spec.model_copy(update={"acceptance": tau})
        errors = planner.calibration_errors(list(calibration), dep, p, planner.shipped_calibration(), stack, on)
        p = planner.make_plan(
            dep,
            rc.serving,
            spec,
            rc.parallel,
            rc.trtllm,
            calibration=cal,
            errors=errors,
            release=row,
            stack=stack,
            tables=on_gpu,
        )
    p.warnings = r.warnings + installed + p.warnings
    return p
