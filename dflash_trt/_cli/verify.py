"""dflash-trt verify: a bundle checked offline, and with --endpoint the deployment's acceptance test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from dflash_trt._cli.common import JsonOpt, err, out, print_json
from dflash_trt._cli.load_options import MAX_REQUESTS
from dflash_trt._cli.tune import _ints
from dflash_trt.errors import DFlashError
from dflash_trt.plan import MAX_TOKENS

STYLE = {"pass": "green", "fail": "red", "not measured": "yellow"}


VerifyBundleArg = Annotated[Path, typer.Argument(help="Bundle directory written by 'dflash-trt build'.")]
VerifyEndpointOpt = Annotated[
    str | None,
    typer.Option(
        "--endpoint",
        help="The running deployment (serve.sh or 'dflash-trt serve') to measure: lossless, τ, draft "
        "lengths, GPU memory.",
    ),
]
VerifyBaselineOpt = Annotated[
    str | None,
    typer.Option(
        "--baseline",
        help="With --endpoint: the same target served without speculation; the greedy completions must "
        "agree. Default: the reference runtime on the bundle's weights (small targets).",
    ),
]
VerifyModelOpt = Annotated[
    str | None, typer.Option("--model", help="Model id to request (default: the server's first).")
]
BaselineModelOpt = Annotated[str | None, typer.Option("--baseline-model", help="Model id on --baseline.")]
VerifyPromptsOpt = Annotated[
    Path | None,
    typer.Option(
        "--prompts",
        help="JSONL with 'kind' and 'prompt' or 'messages' (default: the package's code, math, prose and chat set).",
    ),
]
VerifyMaxTokensOpt = Annotated[
    int, typer.Option("--max-tokens", "-n", min=1, max=MAX_TOKENS, help="Tokens per greedy completion.")
]
VerifyConcurrencyOpt = Annotated[
    str, typer.Option("--concurrency", help="Load levels the schedule, τ and memory are measured at, comma-separated.")
]
VerifyRequestsOpt = Annotated[
    int | None,
    typer.Option(
        "--requests", min=1, max=MAX_REQUESTS, help="Requests per level (default: max(prompts, 2 x concurrency))."
    ),
]
AcceptStatsOpt = Annotated[
    Path | None,
    typer.Option(
        "--accept-stats",
        help="TensorRT-LLM's acceptance files: the "
        "TLLM_DFLASH_ACCEPT_STATS_DIR trtllm-serve runs with "
        "(per-position acceptance).",
    ),
]
ReferenceOpt = Annotated[
    bool | None,
    typer.Option(
        "--reference/--no-reference",
        help="Run the bundle's target on the reference runtime (baseline without "
        "--baseline, margins where the server sends no logprobs). Default: targets up to 4 GiB.",
    ),
]
TrapProbeOpt = Annotated[
    bool,
    typer.Option(
        "--trap-probe/--no-trap-probe",
        help="With --endpoint: after the levels, a load above the schedule's top, "
        "then low concurrency; τ must recover to the plan's (the zero-draft trap, TensorRT-LLM PR #16888).",
    ),
]
ReportOpt = Annotated[
    Path | None,
    typer.Option(
        "--report", help="Also write the JSON report here (with --endpoint, 'dflash-trt plan --calibration' reads it)."
    ),
]


def verify(
    bundle: VerifyBundleArg,
    endpoint: VerifyEndpointOpt = None,
    baseline: VerifyBaselineOpt = None,
    model: VerifyModelOpt = None,
    baseline_model: BaselineModelOpt = None,
    prompts: VerifyPromptsOpt = None,
    max_tokens: VerifyMaxTokensOpt = 64,
    concurrency: VerifyConcurrencyOpt = "1,4",
    requests: VerifyRequestsOpt = None,
    accept_stats: AcceptStatsOpt = None,
    reference: ReferenceOpt = None,
    trap_probe: TrapProbeOpt = True,
    report: ReportOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check a bundle, and the deployment serving it.

    Offline: every file against the sha256 the manifest records, and trtllm/config.yaml against the TensorRT-LLM
    release's rules and the plan. With --endpoint URL (on the GPU machine, after serve.sh): greedy completions of a
    code, math, prose and chat prompt set against --baseline (a divergence is reported with its token position and
    the target's top-2 logprob margin: a near-tie is numerics, a clear margin a bug); τ and per-position acceptance
    against the plan's τ (a collapse names its likely causes); the draft length in force per concurrency and GPU
    memory in use against the plan, where the server reports them ("not measured" otherwise); then the zero-draft
    probe: a load above the schedule's top, then low concurrency, where τ must recover to the plan's.

    Exit 0 when every check holds, 1 naming each that does not, 2 on bad input.
    """
    from dflash_trt.bench import verify as V  # start-up: asyncio and ssl (the load generator, ~0.1 s)

    if endpoint is None and any(x is not None for x in (baseline, accept_stats, prompts)):
        raise DFlashError("--baseline, --prompts and --accept-stats go with --endpoint URL")
    kw = (
        {}
        if endpoint is None
        else dict(
            baseline=baseline,
            model=model,
            baseline_model=baseline_model,
            prompts=prompts,
            max_tokens=max_tokens,
            concurrency=_ints(concurrency, "--concurrency"),
            requests=requests,
            accept_stats=accept_stats,
            reference=reference,
            trap_probe=trap_probe,
        )
    )
    with err.status("verify: checking the bundle") as status:  # transient: a refusal stays one line
        result = V.run(bundle, endpoint, progress=lambda msg: status.update(f"verify: {msg}"), **kw)
    if report is not None:
        report.write_text(json.dumps(result, indent=2) + "\n")
    if as_json:
        print_json(result)
    else:
        show(result)
    if result["failed"]:
        err.print(f"verify: {len(result['failed'])} check(s) failed: {', '.join(result['failed'])}", markup=False)
        raise typer.Exit(1)


def show(r: dict) -> None:
    against = f" against {r['endpoint']['url']}" if "endpoint" in r else ""
    t = Table(title=escape(f"dflash-trt verify {r['bundle']}{against}"))
    for col in ("check", "status", ""):
        t.add_column(col)
    for c in r["checks"]:
        t.add_row(c["name"], f"[{STYLE[c['status']]}]{c['status']}[/]", escape(c["summary"]))
    out.print(t)
    acc = next((c for c in r["checks"] if c["name"] == "acceptance"), None)
    for cause in ((acc or {}).get("details") or {}).get("likely_causes") or []:
        out.print(f"  likely cause: {cause}", markup=False)


def register(app: typer.Typer) -> None:
    app.command("verify")(verify)
