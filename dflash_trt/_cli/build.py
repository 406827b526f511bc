"""dflash-trt build / plan: a recipe (or flags) into a TensorRT-LLM bundle, or just its plan."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from dflash_trt import plan as R
from dflash_trt._cli.common import (
    DrafterOpt,
    GpusPerNodeOpt,
    JsonOpt,
    TargetOpt,
    err,
    out,
    print_json,
)
from dflash_trt.errors import RecipeError
from dflash_trt.ingest import CurvePoint, PlanMemory
from dflash_trt.plan import Plan, Recipe

if TYPE_CHECKING:  # an annotation only: the pipeline loads when build or plan runs (start-up, ~0.1 s)
    from dflash_trt.deploy import BuildResult

DEFAULT_RECIPE = "tiny"

RecipeArg = Annotated[
    str | None,
    typer.Argument(
        help="Bundled recipe name or YAML file (default: tiny, or none when --target and --drafter are given)."
    ),
]
GpuOpt = Annotated[
    str | None, typer.Option("--gpu", help="GPU model: B300, B200, GB200, H200, H100, L40S, A100, cpu ...")
]
PrecisionOpt = Annotated[
    str | None, typer.Option("--precision", help="Target weights: bf16, fp8, nvfp4, or auto (as shipped).")
]
KvOpt = Annotated[str | None, typer.Option("--kv-cache-dtype", help="KV cache dtype: auto or fp8.")]
SetOpt = Annotated[
    list[str] | None, typer.Option("--set", help="Override a recipe field: KEY.PATH=VALUE (repeatable).")
]
CalibOpt = Annotated[
    str | None, typer.Option("--calib", help="Calibration text: one sample per line, or JSONL with 'prompt'/'text'.")
]
OutputOpt = Annotated[
    Path | None, typer.Option("--output", "-o", help="Bundle directory (default: dflash-out/<recipe>).")
]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Resolve, validate and plan from configs; write nothing.")]
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Replace an existing bundle: only the files its manifest lists; other files in the directory are kept.",
    ),
]
GraphsOpt = Annotated[
    bool,
    typer.Option(
        "--graphs",
        help="Also export the standalone path: ONNX graphs with the DFlash custom ops to OUT/onnx, and "
        "TensorRT engines to OUT/engines where TensorRT and a GPU are present (run by --backend "
        "onnx|tensorrt).",
    ),
]


# The recipe field each flag sets, as the typed value typer parsed (never re-read as YAML).
FLAG_FIELDS = {
    "--gpu": "gpu.name",
    "--gpus-per-node": "gpu.count",
    "--precision": "precision.weights",
    "--kv-cache-dtype": "precision.kv_cache",
    "--calib": "precision.calib",
    "--graphs": "graphs",
}


def flag_fields(target: str | None, drafter: str | None, flags: dict[str, object]) -> list:
    """``recipe.FieldValue`` for each flag given: ``--target``/``--drafter`` replace the whole
    model reference (its config directory and revision belong to the recipe's model)."""
    fields = []
    for flag, role, ref in (("--target", "target", target), ("--drafter", "drafter", drafter)):
        if ref is not None:
            fields += [
                R.FieldValue(f"{role}.id", ref, flag),
                R.FieldValue(f"{role}.config", None, flag),
                R.FieldValue(f"{role}.revision", None, flag),
            ]
    return fields + [R.FieldValue(FLAG_FIELDS[flag], value, flag) for flag, value in flags.items() if value is not None]


def recipe_from_flags(
    recipe: str | None, target: str | None, drafter: str | None, flags: dict[str, object], sets: list[str] | None
):
    """A Recipe from a name/file plus flags (``{"--precision": "fp8", ...}``, keys of
    :data:`FLAG_FIELDS`); the flags set their fields, then ``--set`` overrides apply."""
    fields = flag_fields(target, drafter, flags)
    if recipe is None and (target is not None or drafter is not None):
        if target is None or drafter is None:
            raise RecipeError("without a recipe, give both --target and --drafter")
        name = f"{Path(target.rstrip('/')).name or 'target'}-{flags.get('--precision') or 'bf16'}"
        base = {"name": name, "target": {"id": target}, "drafter": {"id": drafter}}
        return R.recipe_from_dict(base, where="command line", fields=fields, overrides=sets)
    return R.load_recipe(recipe or DEFAULT_RECIPE, sets, fields=fields)


def build(
    recipe: RecipeArg = None,
    target: TargetOpt = None,
    drafter: DrafterOpt = None,
    gpu: GpuOpt = None,
    gpus_per_node: GpusPerNodeOpt = None,
    precision: PrecisionOpt = None,
    kv_cache_dtype: KvOpt = None,
    calib: CalibOpt = None,
    output: OutputOpt = None,
    set_: SetOpt = None,
    dry_run: DryRunOpt = False,
    force: ForceOpt = False,
    graphs: GraphsOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Build a TensorRT-LLM bundle: quantized target, z-lab drafter, trtllm config and serve.sh.

    Paths: a value given on the command line (a flag or --set) is relative to the working directory; one
    written in a recipe file is relative to that file. A model id is a local directory when it starts with
    ./, ../, / or ~ (on the command line also when it names an existing directory), else a hub id
    org/name[@revision]. One writer at a time per output (a second build or tune fails at once, naming the
    first); a build killed while it swaps the bundle in is finished or rolled back by the next build or tune,
    which says which."""
    flags = {
        "--gpu": gpu,
        "--gpus-per-node": gpus_per_node,
        "--precision": precision,
        "--kv-cache-dtype": kv_cache_dtype,
        "--calib": calib,
        "--graphs": True if graphs else None,
    }  # None: the recipe's own
    r = recipe_from_flags(recipe, target, drafter, flags, set_)
    res = _build_with_progress(r, output, dry_run, force)
    graphs_info = (res.manifest or {}).get("graphs")
    if as_json:
        print_json(
            {
                "recipe": r.name,
                "dry_run": dry_run,
                "out": str(res.out) if res.out else None,
                "plan": res.plan.to_json(),
                "engine": graphs_info,  # today's key, kept (issue #43: --json key paths stay)
                "graphs": graphs_info,  # the manifest's name for it (bundle format 4)
            }
        )
        return
    show_plan(res.plan, r)
    if dry_run:
        out.print(f"dry run: {r.name} validated and planned; nothing written")
        return
    _show_built(res.out, graphs_info)


def _build_with_progress(r: Recipe, output: Path | None, dry_run: bool, force: bool) -> BuildResult:
    """``deploy.build`` under a transient progress bar on stderr (off in a log: a refusal stays one line)."""
    from dflash_trt import deploy  # start-up: the pipeline (~0.1 s), loaded by the commands that use it

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as bar:  # off in a log: a refusal stays one line
        task = bar.add_task(f"building {r.name}", total=None)

        def status(msg):
            bar.update(task, description=msg, total=None, completed=0)

        def progress(done, total):
            bar.update(task, description="calibrating", total=total, completed=done)

        return deploy.build(r, output, dry_run=dry_run, force=force, status=status, progress=progress)


def _show_built(where: Path, graphs_info: dict | None) -> None:
    """Where the bundle was written, and its ONNX graphs and engines when --graphs exported them."""
    out.print(f"bundle written to {where}  (serve: {where}/trtllm/serve.sh)")
    if graphs_info is not None:
        err_max = max(graphs_info["drafter_onnx_max_error"].values())
        out.print(
            f"ONNX: {', '.join(graphs_info['onnx'])} in {where}/onnx (drafter vs PyTorch max error {err_max:.1e})"
        )
        if not graphs_info["engines_built"]:
            out.print(f"engines not built: {graphs_info['engines_reason']}")


def plan(
    recipe: RecipeArg = None,
    target: TargetOpt = None,
    drafter: DrafterOpt = None,
    gpu: GpuOpt = None,
    gpus_per_node: GpusPerNodeOpt = None,
    precision: PrecisionOpt = None,
    kv_cache_dtype: KvOpt = None,
    set_: SetOpt = None,
    calibration: Annotated[
        list[Path] | None,
        typer.Option(
            "--calibration",
            help="Refit the step model on your "
            "own server's measurements first: the JSON of 'dflash-trt bench --endpoint URL "
            "--concurrency ... --json', with and without drafting (--baseline, or two files; "
            "repeatable).",
        ),
    ] = None,
    stack: Annotated[
        str | None,
        typer.Option(
            "--stack",
            help="The serving stack to predict for: trtllm, vllm or "
            "sglang (default: the recipe's server, TensorRT-LLM on a GPU), so engines and published "
            "tables of another engine compare like for like.",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Print the deployment plan (memory per GPU, TP size, draft length, back-off) without building."""
    from dflash_trt import deploy  # start-up: the pipeline (~0.1 s), loaded by the commands that use it

    flags = {
        "--gpu": gpu,
        "--gpus-per-node": gpus_per_node,
        "--precision": precision,
        "--kv-cache-dtype": kv_cache_dtype,
    }
    if stack is not None and stack not in ("trtllm", "vllm", "sglang"):
        raise RecipeError(f"--stack {stack!r}: choose trtllm, vllm or sglang")
    r = recipe_from_flags(recipe, target, drafter, flags, set_)
    p = deploy.plan_resolved(deploy.resolve_recipe(r), calibration=calibration, stack=stack)
    if as_json:
        print_json({"recipe": r.name, "plan": p.to_json()})
        return
    show_plan(p, r)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def show_plan(p: Plan, r: Recipe) -> None:
    """The plan as the terminal reads it: memory per GPU, the drafting table, then its notes."""
    _show_memory(p, r)
    show_budget(p.memory)
    _show_drafting(p)
    _show_notes(p)


def _show_memory(p: Plan, r: Recipe) -> None:
    """The memory-per-GPU table: each term, and the total against the GPU's capacity."""
    m = p.memory
    t = Table(
        title=f"{r.name}: {p.gpus}x {p.gpu}, {p.precision} weights, KV {p.kv_cache}, tp={p.tp}"
        + (f", ep={p.ep}" if p.ep > 1 else "")
    )
    t.add_column("memory per GPU")
    t.add_column("", justify="right")
    arena = "drafter context arena" + (" (in the KV pool)" if m.arena_in_kv_pool else " (dense, outside the pool)")
    batch, seq = p.max_batch_size or r.serving.max_batch_size, p.max_seq_len or r.serving.max_seq_len
    rows = [
        ("target weights", m.weights),
        ("drafter (bf16)", m.drafter),
        (arena, m.drafter_arena),
        (f"KV cache ({batch} x {seq} tokens)", m.kv_cache),
        ("activations", m.activations),
        ("runtime reserve", m.reserve),
    ]
    if m.draft_kv_pool:
        rows.insert(3, ("separate draft KV pool (unused, PR #19410)", m.draft_kv_pool))
    rows += [
        (f"CUDA graphs ({len(m.graph_batch_sizes)} batch sizes)", m.cuda_graphs),
        ("start-up headroom (PR #19466)", m.headroom),
    ]
    for label, value in rows:
        t.add_row(label, _gib(value))
    t.add_row("total", f"{_gib(m.total)} of {_gib(m.capacity)}")
    out.print(t)


def _show_drafting(p: Plan) -> None:
    """The drafting table: per batch size the draft length, the predicted speedup and throughput."""
    s = Table(
        title=f"drafting: block {p.block_size}, max_draft_len {p.max_draft_len}, expected τ {p.acceptance} "
        f"(α {p.alpha}), draft attention {p.attention_backend}"
    )
    cols = ["batch", "draft", "speedup (range)"] + (["MTP"] if p.mtp else []) + ["best", "tok/s/user", "tok/s/GPU"]
    for col in cols:
        s.add_column(col, justify="right")
    pred = {r.batch: r for r in p.predicted}
    for row in p.curve:
        r = pred.get(row.batch)
        lo, hi = row.speedup_range or [row.speedup, row.speedup]
        cells = [
            str(row.batch),
            str(row.draft_len) if row.draft_len else "off",
            f"{row.speedup:.2f}x ({lo:.2f}-{hi:.2f})",
        ]
        if p.mtp:
            cells.append(f"{row.mtp_speedup or 0.0:.2f}x")
        cells += [
            {"autoregressive": "AR"}.get(row.winner or "", row.winner or ""),
            f"{r.tokens_per_second_per_user if r else 0:.0f}",
            f"{r.output_tokens_per_second_per_gpu if r else 0:.0f}",
        ]
        s.add_row(*cells)
    out.print(s)


def _show_notes(p: Plan) -> None:
    """The lines under the tables: the step model and its sources, ranges, the MTP arm, back-off,
    what the release drafts, then each warning once."""
    if p.calibration:
        out.print(f"step model: {p.calibration}", markup=False)
    for term, source in p.step_sources.items():
        out.print(f"  {term} ({p.stack}): {source}", markup=False)
    if p.curve and p.curve[0].range_basis is not None:
        bases = dict.fromkeys(row.range_basis for row in p.curve)
        out.print(f"ranges: leave-one-out errors of {'; '.join(b for b in bases if b)}", markup=False)
    if p.mtp:
        out.print(
            f"MTP arm: {p.mtp.layers} MTP layer(s), num_nextn_predict_layers "
            f"{p.mtp.num_nextn_predict_layers}, expected τ {p.mtp.acceptance} "
            f"({p.mtp.tau_ratio_to_dflash} x DFlash's, published)",
            markup=False,
        )
    if p.schedule == "max_concurrency":
        out.print(f"back-off: max_concurrency {p.max_concurrency} (drafting off above it)")
    elif p.schedule == "draft_len_schedule":
        out.print(f"back-off: draft_len_schedule {p.draft_len_schedule}")
    else:
        out.print(no_backoff_verdict(p.curve))
    out.print(f"TensorRT-LLM {p.trtllm_release} drafts, by batch size: {p.describe_draft_lengths()}", markup=False)
    for w in dict.fromkeys(p.warnings):  # each said once, in order
        err.print(Text.assemble(("warning:", "yellow"), " ", w))  # w as written: no markup in file names


def show_budget(m: PlanMemory) -> None:
    """The KV pool's share and what is left beside it, with PR #19466's estimate beside ours."""
    b, est = m.budget, m.pr19466
    if b is None or est is None:  # a plan without the start-up budget (no GPU memory to size)
        return
    how = "set in the recipe" if b["fraction_source"] == "recipe" else "chosen to leave start-up its room"
    pool = _gib(int(b["fraction"] * b["free_after_load"]))
    out.print(
        f"free_gpu_memory_fraction {b['fraction']:.2f} ({how}): KV pool {pool} for {_gib(b['in_pool'])}; "
        f"beside it {_gib(b['after_pool'])} needed, {_gib(b['left_after_pool'])} spare",
        markup=False,
    )
    out.print(
        f"PR #19466 estimate (an open pull request, not in a release): drafter buffers {_gib(est['buffers'])} "
        f"against a budget of {_gib(est['budget'])} (0.70 x (memory - weights - 4 GiB) x (1 - fraction)): "
        f"{est['verdict']}",
        markup=False,
    )


def no_backoff_verdict(curve: list[CurvePoint]) -> str:
    """The line for a plan without back-off, true to its own table: it says drafting pays only
    where every drafted row of ``curve`` predicts a speedup of at least 1."""
    slow = [row.batch for row in curve if row.draft_len and row.speedup < 1]
    if not slow:
        return "back-off: none (drafting predicted to pay at every planned batch size)"
    where = f"batch {slow[0]}" if len(slow) == 1 else f"batch {slow[0]}-{slow[-1]}"
    return (
        f"back-off: none, yet the table predicts a slowdown at {where}: --set speculative.schedule=auto backs off there"
    )


def register(app: typer.Typer) -> None:
    app.command("build")(build)
    app.command("plan")(plan)
