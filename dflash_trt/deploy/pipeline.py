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
writes through them, runtime / serve / bench read through them. The manifest build writes is
``plan.BundleManifest`` (the recipe stored as the typed ``Recipe``, same JSON);
:func:`check_trtllm_bundle` reads it back through ``plan.read_bundle_manifest``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import platform
import shutil
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from dflash_trt import __version__, ingest
from dflash_trt import plan as planner
from dflash_trt.deploy import drafter as bundle_drafter
from dflash_trt.deploy import output, serve_sh
from dflash_trt.deploy import trtllm_config as trtllm
from dflash_trt.deploy.resolve import Resolved, local_checkpoint, plan_resolved, refuse_trtllm_only, resolve_recipe
from dflash_trt.errors import CheckpointError, DFlashError
from dflash_trt.plan import Recipe

BUNDLE_FORMAT = ingest.BUNDLE_FORMAT


@dataclass
class BuildResult:
    plan: planner.Plan
    out: Path | None
    manifest: dict | None  # the JSON object written to manifest.json
    resolved: Resolved


def default_out(recipe: Recipe) -> Path:
    return Path("dflash-out") / recipe.name


def build(
    recipe: Recipe, out: Path | None = None, dry_run: bool = False, force: bool = False, status=None, progress=None
) -> BuildResult:
    """Run the pipeline. ``status(msg)`` reports stages; ``progress(done, total)`` calibration."""
    say = status or (lambda msg: None)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    out = Path(out) if out is not None else default_out(recipe)
    if not dry_run:
        output.check_output(out, force)
    # Local checkpoints (a directory, the embedded pair) are the directories planning reads too:
    # read once, as checkpoints; hub ones are planned from their configs before the download.
    local = not dry_run and all(local_checkpoint(recipe, role) for role in ("target", "drafter"))
    r = resolve_recipe(recipe, weights=local)
    refuse_trtllm_only(r)
    p = plan_resolved(r)
    timings["plan"] = time.perf_counter() - t0
    if dry_run:
        trtllm.config(recipe, p, r.drafter, r.target)  # what build would write passes the release's schema
        return BuildResult(p, None, None, r)

    with output.lock(out):  # held to the swap: a second build to `out` fails at once
        recovered = output.recover(out)  # a swap a killed writer left: finished or rolled back first
        if recovered:
            p.warnings.append(recovered)
        try:
            output.check_output(out, force)  # again: the output may have changed while we waited
        except DFlashError as exc:  # the refusal says what the recovery did: one line still
            raise type(exc)(f"{recovered}; {exc}" if recovered else str(exc)) from None
        if not local:
            say("resolving checkpoints")
            w = resolve_recipe(recipe, weights=True)
            if (w.target_dir, w.drafter_dir) != (r.target_dir, r.drafter_dir):
                r, p = w, plan_resolved(w)  # exact byte counts from the real checkpoint
                p.warnings += [recovered] if recovered else []
        for d in (r.target_dir, r.drafter_dir):  # links only into each checkpoint's own store, before any write
            ingest.check_links(d)
        tmp = output.start_partial(out)
        try:
            manifest = _write_bundle(r, p, tmp, say, progress, timings)
            timings["total"] = time.perf_counter() - t0
            manifest.timings = {k: round(v, 3) for k, v in timings.items()}
            manifest.files = ingest.bundle_hashes(tmp)  # every file as built: dflash-trt verify checks them
            written = ingest.write_manifest(tmp, manifest)
            output.share(tmp, copied=output.copied_modes(r.target_dir, tmp / ingest.Layout.TARGET, r.quantize))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        left = output.replace(tmp, out)  # a refused swap keeps the built bundle and says where
        p.warnings += [left] if left else []  # what the OS would not remove after it: said, swept next time
    return BuildResult(p, out, written, r)


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
        output.copy_checkpoint(r.target_dir, tmp / "target")
        return None, None
    from dflash_trt.deploy import quantize  # start-up: torch (deploy.quantize imports it)

    rc = r.recipe
    say(f"quantizing the target to {r.precision} with ModelOpt")
    # The calibration file is relative to the recipe file; quantize_target gets the resolved path.
    calib = str(rc.resolve_path(rc.precision.calib)) if rc.precision.calib else None
    info = quantize.quantize_target(
        r.target_dir, tmp / "target", rc.precision.model_copy(update={"calib": calib}), progress=progress
    )
    return info, quantize.verify_export(tmp / "target", r.precision, rc.precision.kv_cache)


def _write_drafter(r: Resolved, tmp: Path, say) -> dict:
    say("writing the drafter (z-lab form, BF16)")
    return bundle_drafter.write_bundle_drafter(r.pair.drafter, tmp / ingest.Layout.DRAFTER)


def serve_check(r: Resolved, p: planner.Plan) -> serve_sh.ServeCheck:
    """What the bundle's serve.sh checks: the release, and the GPUs this node serves with."""
    return serve_sh.ServeCheck(
        release=p.trtllm_release,
        gpu=r.gpu.name,
        sm=r.gpu.sm,
        memory_gb=r.gpu.memory_gb,
        gpus=min(r.recipe.gpu.count, p.tp),
    )


def _write_bundle(r: Resolved, p: planner.Plan, tmp: Path, say, progress, timings) -> planner.BundleManifest:
    rc = r.recipe
    quant_info, verified = _timed(timings, "target", _write_target, r, tmp, say, progress)
    drafter_info = _timed(timings, "drafter", _write_drafter, r, tmp, say)
    mtp = trtllm.config(rc, p, target=r.target, arm="mtp") if p.mtp else None  # the arm users compare with
    trtllm.write(
        tmp / "trtllm",
        trtllm.config(rc, p, r.drafter, r.target),
        rc.serving.host,
        rc.serving.port,
        serve_check(r, p),
        mtp=mtp,
    )
    graphs_info = _timed(timings, "engines", _tensorrt_path, r, tmp, say) if rc.graphs else None

    t = time.perf_counter()
    say("hashing inputs")
    manifest = _manifest(r, p, quant_info, verified, graphs_info)
    manifest.drafter = ingest.DrafterInfo(**drafter_info)
    timings["hash"] = time.perf_counter() - t
    return manifest


def _manifest(
    r: Resolved, p: planner.Plan, quant_info: dict | None, verified: dict | None, graphs_info: dict | None
) -> planner.BundleManifest:
    """What the bundle was built from and how (``plan.BundleManifest``; hashes every input file)."""
    rc, L = r.recipe, ingest.Layout
    manifest = planner.BundleManifest(
        format=BUNDLE_FORMAT,
        name=rc.name,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        recipe=rc.model_copy(deep=True),  # stored in full; where it was read from, the inputs record
        recipe_source=str(rc.source) if rc.source else None,
        inputs={
            "target": _input(rc.target, r.target_dir),
            "drafter": _input(rc.drafter, r.drafter_dir),
            "calibration": _calib_input(rc),
        },
        tools=_versions(quantized=r.quantize),
        trtllm={"release": p.trtllm_release, "image": planner.get_release(p.trtllm_release).image},
        gpu={"name": r.gpu.name, "sm": r.gpu.sm, "memory_gb": r.gpu.memory_gb, "count": r.gpus},
        precision={
            "weights": r.precision,
            "kv_cache": rc.precision.kv_cache,
            "quantized_by": "nvidia-modelopt" if r.quantize else ("as shipped" if r.shipped_quant else None),
            "quantization": quant_info,
            "verified": verified,
        },
        plan=p,
        reference_runtime={
            "target": L.TARGET,
            "drafter": L.DRAFTER,
            "dequantize": r.quantize,
            "source_target": str(r.target_dir.resolve()),
        },
        outputs={
            "target": L.TARGET,
            "drafter": L.DRAFTER,
            "trtllm_config": L.TRTLLM_CONFIG,
            "serve": L.SERVE_SH,
            **({"mtp_config": f"trtllm/{trtllm.MTP_CONFIG}"} if p.mtp else {}),
            **_graphs_outputs(graphs_info),
        },
        # What `dflash-trt serve` reads: the multi-node launch files must match the plan's
        # parallelism, and the embedded server advertises the planned context length.
        serve={
            "tp_size": p.tp,
            "pp_size": 1,
            "gpus_per_node": rc.gpu.count,
            "max_seq_len": rc.serving.max_seq_len,
            **r.pair.serving_chat,
            "drafter_chat": r.pair.trained_chat,
        },
        warnings=p.warnings,
    )
    if graphs_info is not None:
        manifest.graphs = ingest.GraphsInfo.model_validate(graphs_info)
    return manifest


def _graphs_outputs(graphs_info: dict | None) -> dict:
    """The TensorRT path's entries of the manifest's ``outputs``: onnx/ always, engines/ when built."""
    if graphs_info is None:
        return {}
    return {"onnx": ingest.Layout.ONNX, **({"engines": ingest.Layout.ENGINES} if graphs_info["engines_built"] else {})}


def _tensorrt_path(r: Resolved, tmp: Path, say) -> dict:
    """The standalone TensorRT path: ONNX for the drafter (with the two DFlash custom ops; a DFlash2
    drafter's graph also walks its candidate selector, ``graphs.export_drafter``), the
    target (tapped hidden states as extra outputs, KV cache in/out) and the embedding, at the
    shapes of the recipe's serving limits (recorded as the manifest's ``graphs.profile``);
    engines where TensorRT and a GPU are present. The ONNX graphs are exported in float32 from
    the unquantized source target (quantized TensorRT engines are not built here)."""
    import torch  # start-up: torch

    from dflash_trt import export  # start-up: torch (dflash_trt.export)
    from dflash_trt.model import load_target  # start-up: torch (the model face loads it lazily)

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
    return {"id": ref.id, "revision": ref.revision, "path": str(path.resolve()), "sha256": ingest.sha256_files(path)}


def _calib_input(rc: Recipe) -> dict | None:
    if not rc.precision.calib:
        return None
    path = rc.resolve_path(rc.precision.calib)

    return {"path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None}


def _versions(quantized: bool) -> dict:

    out: dict[str, str | None] = {"dflash_trt": __version__, "python": platform.python_version()}
    for pkg in ("torch", "transformers", "safetensors", "pydantic") + (("nvidia-modelopt",) if quantized else ()):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def check_trtllm_bundle(path: str | Path) -> dict:
    """Check a bundle on disk (CI and tests): ``ingest.check_bundle`` (layout, manifest,
    serve.sh, drafter), then what only build knows: the recipe it stored reads as today's
    (``plan.read_bundle_manifest``), the TensorRT-LLM config against its schema, the drafter it
    names, and a ModelOpt export's quantized tensors."""
    root = Path(path)
    bundle = ingest.check_bundle(root)
    m = planner.read_bundle_manifest(bundle)
    if m.trtllm is None or m.precision is None:
        raise CheckpointError(
            f"{bundle.manifest_path}: no {'trtllm' if m.trtllm is None else 'precision'!r} "
            "section; rebuild the bundle with 'dflash-trt build'"
        )
    cfg = trtllm.load_trtllm_config(root, m.trtllm.release)
    model = getattr(cfg.speculative_config, "speculative_model", None)  # the DFlash config names the drafter
    if not model or not (root / model / "config.json").is_file():
        raise CheckpointError(f"{root}: speculative_model {model} is not the bundle's drafter")
    prec = m.precision
    verified = None
    if prec.quantized_by == "nvidia-modelopt":
        from dflash_trt.deploy import quantize  # start-up: torch (deploy.quantize imports it)

        verified = quantize.verify_export(bundle.target, prec.weights, prec.kv_cache)
    return {
        "bundle": str(root),
        "precision": prec.weights,
        "tp": cfg.tensor_parallel_size,
        "max_draft_len": cfg.speculative_config.max_draft_len,
        "quantized": verified,
    }
