"""dflash-trt bench: DFlash vs autoregressive on the reference runtime, same process."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from dflash_trt._cli.common import (
    BackendOpt,
    BlockSizeOpt,
    BundleArg,
    BundleOpt,
    DrafterOpt,
    DtypeOpt,
    JsonOpt,
    KernelsOpt,
    TargetOpt,
    check_refs,
    default_prompts,
    err,
    load_pair_from,
    out,
    print_json,
    save_then_plot,
    steps,
)


# Over 60 lines only because the signature is the command's option list (Typer reads it);
# the body is short and calls one stage per branch.
def bench(
    bundle: BundleArg = None,
    bundle_opt: BundleOpt = None,
    target: TargetOpt = None,
    drafter: DrafterOpt = None,
    prompts: Annotated[str | None, typer.Option(
        "--prompts", help="Prompts file: one per line, or JSONL with 'prompt'.")] = None,
    max_new_tokens: Annotated[int, typer.Option(
        "--max-new-tokens", "--max-tokens", "-n", min=1, help="Tokens per prompt at most.")] = 128,
    block_size: BlockSizeOpt = None,
    chat: Annotated[bool, typer.Option("--chat", help="Wrap prompts in the chat template.")] = False,
    dtype: DtypeOpt = "auto",
    kernels: KernelsOpt = "reference",
    backend: BackendOpt = "torch",
    as_json: JsonOpt = False,
    endpoint: Annotated[str | None, typer.Option("--endpoint", help="Benchmark this OpenAI-compatible server "
                                                    "(URL) instead of running models in-process.")] = None,
    baseline: Annotated[str | None, typer.Option("--baseline", help="With --endpoint: a second server to compare "
                                                    "against (e.g. the same target without drafting).")] = None,
    mtp_endpoint: Annotated[str | None, typer.Option("--mtp-endpoint", help="With --endpoint: the same target "
                                                        "drafting with its own MTP layers (a bundle's "
                                                        "trtllm/config.mtp.yaml); reports which arm wins per "
                                                        "concurrency.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="With --endpoint: model id to request "
                                                 "(default: the server's first).")] = None,
    concurrency: Annotated[str, typer.Option("--concurrency", help="With --endpoint: comma-separated "
                                             "concurrency levels.")] = "1,4,16,32",
    requests: Annotated[int | None, typer.Option("--requests", min=1, help="With --endpoint: requests per level "
                                                    "(default: max(prompts, 2 x concurrency)).")] = None,
    temperature: Annotated[float, typer.Option(min=0.0, help="With --endpoint: sampling temperature.")] = 0.0,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="With --endpoint: ask the server to generate "
                                             "max tokens (vLLM/TRT-LLM/dflash extension).")] = False,
    plot: Annotated[Path | None, typer.Option(
        "--plot", help="With --endpoint: write throughput per GPU against tokens/s per user (DFlash and "
                       "--baseline on one chart), TTFT, ITL and speedup to this PNG; with a BUNDLE, its plan's "
                       "predicted curves too.")] = None,
) -> None:
    """Measure τ, per-position acceptance and speedup over autoregressive decoding, and check losslessness.

    With --endpoint URL: drive any OpenAI-compatible server (trtllm-serve, vLLM, SGLang, 'dflash-trt serve')
    and report per concurrency output tokens/s, tokens/s per user, TTFT, ITL and τ when the server reports it.
    """
    from dflash_trt.errors import DFlashError

    if endpoint is None:
        check_refs(target, drafter, True, bundle or bundle_opt)  # before the runtime (torch) loads
    from dflash_trt.bench import inprocess

    if endpoint is not None and backend != "torch":
        raise DFlashError("--backend runs the models in-process; with --endpoint the server runs them")
    if endpoint is not None:
        bench_endpoint(endpoint, baseline, model, prompts, concurrency, requests, max_new_tokens, temperature,
                       chat, ignore_eos, plot, as_json, bundle=bundle or bundle_opt, mtp=mtp_endpoint)
        return
    if baseline is not None or plot is not None or mtp_endpoint is not None:
        raise DFlashError("--baseline, --mtp-endpoint and --plot go with --endpoint URL")
    if prompts is None:
        if target is not None or bundle is not None or bundle_opt is not None:
            raise DFlashError("no prompts: pass --prompts FILE (one prompt per line, or JSONL with 'prompt')")
        prompts = default_prompts()          # the embedded pair's held-out standard-library prompts
    texts = inprocess.read_prompts(prompts)
    pair = load_pair_from(target, drafter, dtype, bundle=bundle, bundle_opt=bundle_opt, kernels=kernels,
                          backend=backend)
    with steps("prompts", len(texts)) as step:
        report = inprocess.run(pair, texts, max_new_tokens=max_new_tokens, block_size=block_size, chat=chat,
                               progress=step)
    if as_json:
        print_json(report)
        return
    show(report)


def show(r: dict) -> None:
    through = f", {r['backend']} backend" if r.get("backend", "torch") != "torch" else ""
    if r.get("graphs"):
        through += f" ({r['graphs']['target']}, {r['graphs']['drafter']})"
    t = Table(title=f"DFlash vs autoregressive — {r['prompts']} prompts, B={r['block_size']}, greedy{through}")
    t.add_column("")
    t.add_column("DFlash", justify="right")
    t.add_column("autoregressive", justify="right")
    d, a = r["dflash"], r["autoregressive"]
    t.add_row("tokens/s", f"{d['tokens_per_second']:.1f}", f"{a['tokens_per_second']:.1f}")
    t.add_row("τ (tokens per target forward)", f"{d['acceptance_length']:.2f}", "1.00")
    t.add_row("target forwards", str(d["target_forwards"]), str(a["target_forwards"]))
    t.add_row("new tokens", str(d["new_tokens"]), str(a["new_tokens"]))
    out.print(t)
    pp = " ".join(f"{x:.2f}" for x in r["per_position_acceptance"])
    s = r["step"]
    out.print(f"speedup {r['speedup']:.2f}x   lossless {str(r['lossless']).lower()}")
    out.print(f"per-position acceptance [{pp}]")
    out.print(f"step: draft {s['draft_ms']:.2f} ms + verify {s['verify_ms']:.2f} ms "
              f"= {s['step_cost_ratio']:.2f}x one target forward on the block "
              f"(autoregressive forward {s['autoregressive_forward_ms']:.2f} ms)")


def planned_curve(bundle) -> tuple[list[dict] | None, int, str | None]:
    """A bundle's predicted curves (``plan.predicted``), the GPUs one server uses (its tp) and
    the device it was planned for (``plan.gpu``: a GPU model, or cpu; None without a bundle)."""
    from dflash_trt import ingest

    if bundle is None:
        return None, 1, None
    plan = ingest.open_bundle(bundle).manifest.plan
    if plan is None:
        return None, 1, None
    rows = [r.model_dump(mode="json", exclude_unset=True) for r in plan.predicted]   # the plot reads JSON rows
    return rows or None, plan.tp, plan.gpu


def bench_endpoint(endpoint, baseline, model, prompts, concurrency, requests, max_tokens, temperature, chat,
                   ignore_eos, plot, as_json, bundle=None, mtp=None) -> None:
    from dflash_trt.bench import endpoint as loadgen
    from dflash_trt.bench import inprocess
    from dflash_trt.errors import DFlashError

    try:
        levels = [int(x) for x in concurrency.split(",") if x.strip()]
    except ValueError:
        raise DFlashError(f"--concurrency {concurrency!r}: expected comma-separated integers, e.g. 1,4,16,32") from None
    texts = inprocess.read_prompts(prompts) if prompts else None
    with steps("benchmarking", len(levels) * (1 + bool(baseline) + bool(mtp))) as step:
        report = loadgen.run(endpoint, model=model, baseline=baseline, mtp=mtp, prompts=texts, concurrency=levels,
                             requests=requests, max_tokens=max_tokens, temperature=temperature, chat=chat,
                             ignore_eos=ignore_eos,
                             progress=lambda url, c: step(desc=f"benchmarking: {url} concurrency {c} done"))
    refused = None
    if plot is not None:   # the results are saved (PLOT.json) before the figure is drawn
        predicted, gpus, device = planned_curve(bundle)
        refused = save_then_plot(report, plot, lambda p: loadgen.plot(report, p, predicted=predicted, gpus=gpus,
                                                                      device=device,
                                                                      name=Path(bundle).name if bundle else None))
        report["plot"] = None if refused else str(plot)
    if as_json:
        print_json(report)
    else:
        show_endpoint(report)
    if refused:
        raise DFlashError(refused)


def _fmt(x, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def show_endpoint(r: dict) -> None:
    speed = {row["concurrency"]: row["speedup"] for row in r.get("comparison", {}).get("speedup", [])}
    for key in ("endpoint", "mtp", "baseline"):
        if key not in r:
            continue
        e = r[key]
        # short headers that wrap at spaces and a light box: all ten columns fit 80 columns whole
        t = Table(title=f"{key}: {e['url']} ({e['model']}), max {r['max_tokens']} tokens, T={r['temperature']}",
                  caption="conc: concurrent requests; TTFT, ITL in ms", box=box.SIMPLE_HEAD, pad_edge=False)
        for col in ("conc", "ok", "tok/s", "tok/s per user", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "τ"):
            t.add_column(col, justify="right")
        if key == "endpoint" and speed:
            t.add_column("speedup", justify="right", min_width=7)
        for lv in e["levels"]:
            row = [str(lv["concurrency"]), f"{lv['ok']}/{lv['requests']}", _fmt(lv["output_tokens_per_second"], ".0f"),
                   _fmt(lv["tokens_per_second_per_user"]), _fmt(lv["ttft_ms"]["median"], ".0f"),
                   _fmt(lv["ttft_ms"]["p99"], ".0f"),
                   _fmt(lv["itl_ms"]["median"]), _fmt(lv["itl_ms"]["p99"]), _fmt(lv["acceptance_length"], ".2f")]
            if key == "endpoint" and speed:
                row.append(_fmt(speed.get(lv["concurrency"]), ".2f") + "x")
            t.add_row(*row)
        out.print(t)
        for lv in e["levels"]:
            for msg in lv["errors"]:
                err.print(f"[yellow]concurrency {lv['concurrency']}: {msg}[/yellow]", markup=True)
    if "comparison" in r:
        stop = r["comparison"]["stops_paying_at"]
        out.print("drafting pays at every concurrency measured" if stop is None
                  else f"drafting stops paying at concurrency {stop} (speedup < 1)")
    if r.get("mtp"):
        show_arms(r["arms"])
    if r.get("plot"):
        out.print(f"plot: {r['plot']}")


def show_arms(rows: list[dict]) -> None:
    """Output tokens/s of DFlash, MTP and autoregressive per concurrency, and the winner."""
    t = Table(title="arms: output tok/s per concurrency")
    for col in ("concurrency", "DFlash", "MTP", "autoregressive", "winner", "margin"):
        t.add_column(col, justify="right")
    for row in rows:
        t.add_row(str(row["concurrency"]), _fmt(row["dflash"]), _fmt(row["mtp"]), _fmt(row["autoregressive"]),
                  row["winner"], "-" if row["margin"] is None else f"+{row['margin']:.0%}")
    out.print(t)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
