"""The build pipeline: recipe -> checks -> plan -> quantize -> bundle, written atomically.

Stages, each a plain function called in order by :func:`build`:

1. :func:`resolve` -- the GPU and precision rules (refused before any work), the model
   config directories, the pair check (``ingest.validate_pair``), whether the target
   is already quantized, and the shapes the planner needs. Config directories only: a
   recipe's ``target.config``/``drafter.config`` where they hold every field the planner
   needs, else the hub's (or the local Hugging Face cache's) configs at the pinned revision;
   offline with nothing cached, a recipe whose configs lack fields is refused in one line.
2. :func:`dflash_trt.plan.deployment.make_plan` -- memory, TP size, draft length and back-off.
3. (not ``--dry-run``) the weights: the target copied (bf16 / as shipped) or calibrated
   and exported by ModelOpt (fp8 / nvfp4) and verified from its safetensors; the drafter
   in z-lab form (BF16, ascending target layers: ``bundle_drafter``); ``trtllm/config.yaml`` +
   ``serve.sh`` (which checks the TensorRT-LLM version and the GPUs); ``manifest.json``. All into a
   temporary sibling directory renamed to OUT at the end; on any failure it is removed.

The bundle's layout, its typed manifest and the checks that need no TensorRT-LLM schema
live in ``ingest`` (``ingest.Bundle``, ``ingest.Manifest``, ``ingest.check_bundle``): build
writes through them, runtime / serve / bench read through them.
"""

from __future__ import annotations

import datetime as _dt
import platform
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from dflash_trt import ingest
from dflash_trt import plan as planner
from dflash_trt.deploy import drafter as bundle_drafter
from dflash_trt.deploy import output, serve_sh
from dflash_trt.deploy import trtllm_config as trtllm
from dflash_trt.errors import CheckpointError, CompatibilityError, DFlashError, RecipeError
from dflash_trt.plan import GPU, DraftShape, Recipe, TargetShape, quant_precision, read_sizes

BUNDLE_FORMAT = ingest.BUNDLE_FORMAT
SKIP_SUFFIXES = (".bin", ".pt", ".pth", ".py", ".pkl", ".msgpack", ".h5", ".ckpt")


@dataclass
class Resolved:
    recipe: Recipe
    gpu: GPU
    gpus: int
    precision: str            # effective: bf16 | fp8 | nvfp4 | mxfp4
    quantize: bool            # True: ModelOpt runs at build time
    pair: ingest.PairSpec     # the pair as ingest read it, once: every later stage takes it
    target: TargetShape
    drafter: DraftShape
    shipped_quant: dict | None
    warnings: list[str] = field(default_factory=list)
    mtp_layers: int = 0                    # MTP layers the target's config declares: build also writes the MTP arm

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
        local = Path(ref.id).is_absolute() or ref.id.startswith(ingest.EMBEDDED_PREFIX)   # anchored by the recipe
        return ingest.resolve(ref.id, role, expected_bytes=_expected_bytes(recipe, ref), configs_only=not weights,
                              hub_only=not local, **kwargs)
    except CheckpointError as exc:
        if weights or not lacking:
            raise
        raise RecipeError(_offline_refusal(recipe, role, lacking)) from exc


def _local(recipe: Recipe, role: str) -> bool:
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
    fetch = " and ".join(f"`hf download {getattr(recipe, r).id}"
                         + (f" --revision {getattr(recipe, r).revision}" if getattr(recipe, r).revision else "")
                         + " --include '*.json'`" for r in roles)
    return (f"recipe {recipe.name}: its shipped configs lack {', '.join(fields)} and {role} {ref.id}{at} is not "
            f"in the Hugging Face cache (and the hub is offline or unreachable); fetch the configs with {fetch} "
            "(or run with hub access), or pass --target DIR --drafter DIR")


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
    tdir, ddir = _ref_dir(recipe, "target", weights), _ref_dir(recipe, "drafter", weights)
    pair = ingest.read_pair(tdir, ddir, require_weights=weights, enable_thinking=recipe.serving.enable_thinking)
    shipped_q = pair.quantization
    shipped = quant_precision(shipped_q) if shipped_q else None
    if shipped_q and shipped is None:
        raise CompatibilityError(f"target {recipe.target.id}: quantization "
                                 f"{shipped_q.get('quant_method') or shipped_q} "
                                 "is not one TensorRT-LLM's DFlash path is planned for (fp8, nvfp4, mxfp4)")
    if shipped and requested not in ("auto", shipped):
        raise CompatibilityError(f"target {recipe.target.id} is already {shipped}-quantized; it cannot be built at "
                                 f"{requested}: use --precision auto (or {shipped}), or start from the BF16 checkpoint")
    precision = shipped or ("bf16" if requested == "auto" else requested)
    planner.check_precision(gpu, precision, kv)
    warnings = pair.warnings
    chat = ingest.chat_mismatch(pair.trained_chat, pair.serving_chat)
    if chat:
        warnings.append(chat)
    dcfg = pair.drafter.config
    ignored = planner.ignored_drafter_keys(dcfg)
    if ignored:
        warnings.append(ignored)
    planner.check_drafter(dcfg, recipe.trtllm.release)
    planner.refuse_quantized_drafter(pair.drafter_quantization, f"drafter {recipe.drafter.id}")
    return Resolved(recipe=recipe, gpu=gpu, gpus=gpus, precision=precision,
                    quantize=shipped is None and precision in ("fp8", "nvfp4"), pair=pair,
                    target=TargetShape.from_spec(pair.target, shipped_precision=shipped),
                    drafter=DraftShape.from_spec(pair.drafter), shipped_quant=shipped_q, warnings=warnings,
                    mtp_layers=planner.mtp_layers(pair.target.raw_config))


def _refuse_trtllm_only(r: Resolved) -> None:
    """A bundle for TensorRT-LLM alone (no ``graphs``) of a target the recipe's TensorRT-LLM release
    cannot capture hidden states from (``plan.trtllm_capture``), in one line naming the runtimes
    that still run the pair."""
    if r.recipe.graphs:
        return
    spec = r.pair.target
    why = planner.capture_missing(spec.architecture, r.recipe.trtllm.release)
    if why:
        raise CompatibilityError(
            f"target {r.recipe.target.id}: TensorRT-LLM {r.recipe.trtllm.release}'s {spec.architecture} has no "
            f"hidden-state capture hook ({why}), so DFlash cannot run there; build with --graphs, or serve the "
            "pair with the reference runtime (dflash-trt generate / bench / serve)")


def plan_resolved(r: Resolved, calibration: list[Path] | None = None) -> planner.Plan:
    """The plan; with ``calibration`` (``bench --endpoint --json`` files) the step model's constants
    are first refitted on those measurements (:mod:`dflash_trt.plan.calibrate`)."""
    rc = r.recipe
    dep = planner.Deployment(target=r.target, drafter=r.drafter, gpu=r.gpu, gpus=r.gpus, precision=r.precision,
                             kv_cache=rc.precision.kv_cache, mtp_layers=r.mtp_layers)
    spec = rc.speculative
    # non-causal windowed drafter layers rule out the TRTLLM draft attention
    backend = planner.drafter_attention_backend(spec.attention_backend, r.drafter_config, r.gpu.sm,
                                                planner.get_release(rc.trtllm.release))
    spec = spec.model_copy(update={"attention_backend": backend})
    p = planner.make_plan(dep, rc.serving, spec, rc.parallel, rc.trtllm)
    if calibration:
        cal, tau = planner.calibration_from_files(list(calibration), dep, p, planner.shipped_calibration(),
                                                    planner.stack_for(r.gpu))
        if tau is not None and spec.acceptance is None:
            spec = spec.model_copy(update={"acceptance": tau})
        errors = planner.calibration_errors(list(calibration), dep, p, planner.shipped_calibration(),
                                            planner.stack_for(r.gpu))
        p = planner.make_plan(dep, rc.serving, spec, rc.parallel, rc.trtllm, calibration=cal, errors=errors)
    p.warnings = r.warnings + p.warnings
    return p


@dataclass
class BuildResult:
    plan: planner.Plan
    out: Path | None
    manifest: dict | None     # the JSON object written to manifest.json
    resolved: Resolved


def default_out(recipe: Recipe) -> Path:
    return Path("dflash-out") / recipe.name


def build(recipe: Recipe, out: Path | None = None, dry_run: bool = False, force: bool = False,
          status=None, progress=None) -> BuildResult:
    """Run the pipeline. ``status(msg)`` reports stages; ``progress(done, total)`` calibration."""
    say = status or (lambda msg: None)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    out = Path(out) if out is not None else default_out(recipe)
    if not dry_run:
        output.check_output(out, force)
    # Local checkpoints (a directory, the embedded pair) are the directories planning reads too:
    # read once, as checkpoints; hub ones are planned from their configs before the download.
    local = not dry_run and all(_local(recipe, role) for role in ("target", "drafter"))
    r = resolve_recipe(recipe, weights=local)
    _refuse_trtllm_only(r)
    p = plan_resolved(r)
    timings["plan"] = time.perf_counter() - t0
    if dry_run:
        trtllm.config(recipe, p, r.drafter, r.target)  # what build would write passes the release's schema
        return BuildResult(p, None, None, r)

    with output.lock(out):   # held to the swap: a second build to `out` fails at once
        output.check_output(out, force)   # again: the output may have changed while we waited
        if not local:
            say("resolving checkpoints")
            w = resolve_recipe(recipe, weights=True)
            if (w.target_dir, w.drafter_dir) != (r.target_dir, r.drafter_dir):
                r, p = w, plan_resolved(w)  # exact byte counts from the real checkpoint
        tmp = output.start_partial(out)
        try:
            manifest = _write_bundle(r, p, tmp, say, progress, timings)
            timings["total"] = time.perf_counter() - t0
            manifest.timings = {k: round(v, 3) for k, v in timings.items()}
            manifest.files = ingest.bundle_hashes(tmp)   # every file as built: dflash-trt verify checks them
            written = ingest.write_manifest(tmp, manifest)
            output.share(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        output.replace(tmp, out)   # a refused swap keeps the built bundle and says where
    return BuildResult(p, out, written, r)


def _copy_checkpoint(src: Path, dst: Path) -> None:
    """A checkpoint's files (configs, safetensors, tokenizer), never pickles or code."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        if f.is_file() and not f.name.startswith(".") and not f.name.endswith(SKIP_SUFFIXES):
            shutil.copy2(f, dst / f.name)


def _timed(timings: dict[str, float], stage: str, fn, *args):
    """``fn(*args)``, its wall time recorded as ``timings[stage]``."""
    t = time.perf_counter()
    out = fn(*args)
    timings[stage] = time.perf_counter() - t
    return out


def _write_target(r: Resolved, tmp: Path, say, progress) -> tuple[dict | None, dict | None]:
    """OUT/target: copied (bf16 / as shipped), or calibrated and exported by ModelOpt and verified.
    Returns (quantization info, verification) for the manifest; (None, None) for a copy."""
    if not r.quantize:
        say("copying the target")
        _copy_checkpoint(r.target_dir, tmp / "target")
        return None, None
    from dflash_trt.deploy import quantize

    rc = r.recipe
    say(f"quantizing the target to {r.precision} with ModelOpt")
    # The calibration file is relative to the recipe file; quantize_target gets the resolved path.
    calib = str(rc.resolve_path(rc.precision.calib)) if rc.precision.calib else None
    info = quantize.quantize_target(r.target_dir, tmp / "target", rc.precision.model_copy(update={"calib": calib}),
                                    progress=progress)
    return info, quantize.verify_export(tmp / "target", r.precision, rc.precision.kv_cache)


def _write_drafter(r: Resolved, tmp: Path, say) -> dict:
    say("writing the drafter (z-lab form, BF16)")
    return bundle_drafter.write_bundle_drafter(r.pair.drafter, tmp / ingest.Layout.DRAFTER)


def serve_check(r: Resolved, p: planner.Plan) -> serve_sh.ServeCheck:
    """What the bundle's serve.sh checks: the release, and the GPUs this node serves with."""
    return serve_sh.ServeCheck(release=p.trtllm_release, gpu=r.gpu.name, sm=r.gpu.sm, memory_gb=r.gpu.memory_gb,
                               gpus=min(r.recipe.gpu.count, p.tp))


def _write_bundle(r: Resolved, p: planner.Plan, tmp: Path, say, progress, timings) -> ingest.Manifest:
    rc = r.recipe
    quant_info, verified = _timed(timings, "target", _write_target, r, tmp, say, progress)
    drafter_info = _timed(timings, "drafter", _write_drafter, r, tmp, say)
    mtp = trtllm.config(rc, p, target=r.target, arm="mtp") if p.mtp else None   # the arm users compare with
    trtllm.write(tmp / "trtllm", trtllm.config(rc, p, r.drafter, r.target), rc.serving.host, rc.serving.port,
                 serve_check(r, p), mtp=mtp)
    engine_info = _timed(timings, "engines", _tensorrt_path, r, tmp, say) if rc.graphs else None

    t = time.perf_counter()
    say("hashing inputs")
    manifest = _manifest(r, p, quant_info, verified, engine_info)
    manifest.drafter = ingest.DrafterInfo(**drafter_info)
    timings["hash"] = time.perf_counter() - t
    return manifest


def _manifest(r: Resolved, p: planner.Plan, quant_info: dict | None, verified: dict | None,
              engine_info: dict | None) -> ingest.Manifest:
    """What the bundle was built from and how (``ingest.Manifest``; hashes every input file)."""
    rc, L = r.recipe, ingest.Layout
    manifest = ingest.Manifest(
        format=BUNDLE_FORMAT,
        name=rc.name,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        recipe=rc.model_dump(mode="json", exclude={"source", "incomplete"}),   # the inputs record what was read
        recipe_source=str(rc.source) if rc.source else None,
        inputs={"target": _input(rc.target, r.target_dir), "drafter": _input(rc.drafter, r.drafter_dir),
                "calibration": _calib_input(rc)},
        tools=_versions(quantized=r.quantize),
        trtllm={"release": p.trtllm_release, "image": planner.get_release(p.trtllm_release).image},
        gpu={"name": r.gpu.name, "sm": r.gpu.sm, "memory_gb": r.gpu.memory_gb, "count": r.gpus},
        precision={
            "weights": r.precision, "kv_cache": rc.precision.kv_cache,
            "quantized_by": "nvidia-modelopt" if r.quantize else ("as shipped" if r.shipped_quant else None),
            "quantization": quant_info, "verified": verified,
        },
        plan=p,
        reference_runtime={"target": L.TARGET, "drafter": L.DRAFTER, "dequantize": r.quantize,
                           "source_target": str(r.target_dir.resolve())},
        outputs={"target": L.TARGET, "drafter": L.DRAFTER, "trtllm_config": L.TRTLLM_CONFIG, "serve": L.SERVE_SH,
                 **({"mtp_config": f"trtllm/{trtllm.MTP_CONFIG}"} if p.mtp else {}), **_engine_outputs(engine_info)},
        # What `dflash-trt serve` reads: the multi-node launch files must match the plan's
        # parallelism, and the embedded server advertises the planned context length.
        serve={"tp_size": p.tp, "pp_size": 1, "gpus_per_node": rc.gpu.count,
               "max_seq_len": rc.serving.max_seq_len,
               **r.pair.serving_chat, "drafter_chat": r.pair.trained_chat},
        warnings=p.warnings,
    )
    if engine_info is not None:
        manifest.engine = ingest.EngineInfo.model_validate(engine_info)
    return manifest


def _engine_outputs(engine_info: dict | None) -> dict:
    """The TensorRT path's entries of the manifest's ``outputs``: onnx/ always, engines/ when built."""
    if engine_info is None:
        return {}
    return {"onnx": ingest.Layout.ONNX, **({"engines": ingest.Layout.ENGINES} if engine_info["engines_built"] else {})}


def _tensorrt_path(r: Resolved, tmp: Path, say) -> dict:
    """The standalone TensorRT path: ONNX for the drafter (with the two DFlash custom ops; a DFlash2
    drafter's graph also walks its candidate selector, ``graphs.export_drafter``), the
    target (tapped hidden states as extra outputs, KV cache in/out) and the embedding, at the
    shapes of the recipe's serving limits (recorded as the manifest's ``engine.profile``);
    engines where TensorRT and a GPU are present. The ONNX graphs are exported in float32 from
    the unquantized source target (quantized TensorRT engines are not built here)."""
    import torch

    from dflash_trt import export
    from dflash_trt.model import load_target

    drafter = ingest.load_drafter(tmp / "drafter", dtype=torch.float32)
    model = load_target(r.target_dir, dtype=torch.float32)
    profile = export.profile_for(r.recipe.serving, drafter.cfg.block_size)
    info = export.export_graphs(drafter, model, tmp / "onnx", profile, say)
    ok, why = export.engine_support()
    info.update(engines_built=False, engines_reason=why or None)
    if ok:
        say("building TensorRT engines with the DFlash plugins")
        export.build_engines(tmp / "onnx", tmp / "engines", profile)
        info["engines_built"] = True
    return info


def _input(ref, path: Path) -> dict:
    return {"id": ref.id, "revision": ref.revision, "path": str(path.resolve()),
            "sha256": ingest.sha256_files(path)}


def _calib_input(rc: Recipe) -> dict | None:
    if not rc.precision.calib:
        return None
    path = rc.resolve_path(rc.precision.calib)
    import hashlib

    return {"path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None}


def _versions(quantized: bool) -> dict:
    from importlib import metadata

    from dflash_trt import __version__

    out: dict[str, str | None] = {"dflash_trt": __version__, "python": platform.python_version()}
    for pkg in ("torch", "transformers", "safetensors", "pydantic") + (("nvidia-modelopt",) if quantized else ()):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def check_trtllm_bundle(path: str | Path) -> dict:
    """Check a bundle on disk (CI and tests): ``ingest.check_bundle`` (layout, manifest,
    serve.sh, drafter), then what only build knows: the TensorRT-LLM config against its
    schema, the drafter it names, and a ModelOpt export's quantized tensors."""
    root = Path(path)
    bundle = ingest.check_bundle(root)
    m = bundle.built
    if m.trtllm is None or m.precision is None:
        raise CheckpointError(f"{bundle.manifest_path}: no {'trtllm' if m.trtllm is None else 'precision'!r} "
                              "section; rebuild the bundle with 'dflash-trt build'")
    cfg = trtllm.load_trtllm_config(root, m.trtllm.release)
    model = getattr(cfg.speculative_config, "speculative_model", None)   # the DFlash config names the drafter
    if not model or not (root / model / "config.json").is_file():
        raise CheckpointError(f"{root}: speculative_model {model} is not the bundle's drafter")
    prec = m.precision
    verified = None
    if prec.quantized_by == "nvidia-modelopt":
        from dflash_trt.deploy import quantize

        verified = quantize.verify_export(bundle.target, prec.weights, prec.kv_cache)
    return {"bundle": str(root), "precision": prec.weights, "tp": cfg.tensor_parallel_size,
            "max_draft_len": cfg.speculative_config.max_draft_len, "quantized": verified}
