"""dflash-trt bench: DFlash vs autoregressive on the reference runtime, same process."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
import yaml

from dflash_trt import ingest
from dflash_trt._cli.bench_show import show, show_endpoint
from dflash_trt._cli.common import (
    BackendOpt,
    BlockSizeOpt,
    BundleArg,
    DrafterOpt,
    DtypeOpt,
    JsonOpt,
    KernelsOpt,
    TargetOpt,
    check_refs,
    default_prompts,
    load_pair_from,
    print_json,
    save_then_plot,
    steps,
)
from dflash_trt._cli.generate import context_len
from dflash_trt._cli.load_options import (
    MAX_REQUESTS,
    BurstinessOpt,
    DatasetFormatOpt,
    DurationOpt,
    GoodputOpt,
    InputLenOpt,
    MaxTokensOpt,
    OutputLenOpt,
    PromptsOpt,
    RepeatsOpt,
    RequestRateOpt,
    SeedOpt,
    WarmupOpt,
    dataset,
    rates,
)
from dflash_trt.bench import datasets, plots
from dflash_trt.errors import DFlashError

ChatOpt = Annotated[bool, typer.Option("--chat", help="Wrap prompts in the chat template.")]
EndpointOpt = Annotated[
    str | None,
    typer.Option(
        "--endpoint", help="Benchmark this OpenAI-compatible server (URL) instead of running models in-process."
    ),
]
BaselineOpt = Annotated[
    str | None,
    typer.Option(
        "--baseline",
        help="With --endpoint: a second server to compare against (e.g. the same target without drafting).",
    ),
]
MtpEndpointOpt = Annotated[
    str | None,
    typer.Option(
        "--mtp-endpoint",
        help="With --endpoint: the same target "
        "drafting with its own MTP layers (a bundle's "
        "trtllm/config.mtp.yaml); reports which arm wins per "
        "concurrency.",
    ),
]
ModelOpt = Annotated[
    str | None, typer.Option("--model", help="With --endpoint: model id to request (default: the server's first).")
]
ConcurrencyOpt = Annotated[
    str | None,
    typer.Option(
        "--concurrency",
        help="With --endpoint: closed-loop levels, "
        "comma-separated (default 1,4,16,32; none when only "
        "--request-rate is given).",
    ),
]
RequestsOpt = Annotated[
    int | None,
    typer.Option(
        "--requests",
        min=1,
        max=MAX_REQUESTS,
        help="With --endpoint: requests per level (default: max(prompts, 2 x concurrency)).",
    ),
]
TemperatureOpt = Annotated[float, typer.Option(min=0.0, help="With --endpoint: sampling temperature.")]
IgnoreEosOpt = Annotated[
    bool,
    typer.Option(
        "--ignore-eos", help="With --endpoint: ask the server to generate max tokens (vLLM/TRT-LLM/dflash extension)."
    ),
]
PlotOpt = Annotated[
    Path | None,
    typer.Option(
        "--plot",
        help="With --endpoint: write throughput per GPU against tokens/s per user (DFlash and "
        "--baseline on one chart), TTFT, ITL and speedup to this PNG; with a BUNDLE, its plan's "
        "predicted curves too.",
    ),
]


@dataclass(frozen=True)
class BenchOptions:
    """``bench``'s options as typer parsed them (one field per parameter of :func:`bench`, same name,
    same type: tests/test_cli_conventions.py holds that), handed whole to the in-process or endpoint run."""

    bundle: str | None
    target: str | None
    drafter: str | None
    prompts: str | None
    dataset_format: str
    input_len: int | None
    output_len: int | None
    seed: int | None
    max_tokens: int
    block_size: int | None
    chat: bool
    dtype: str
    kernels: str
    backend: str
    as_json: bool
    endpoint: str | None
    baseline: str | None
    mtp_endpoint: str | None
    model: str | None
    concurrency: str | None
    requests: int | None
    temperature: float
    ignore_eos: bool
    request_rate: str | None
    burstiness: float
    duration: float | None
    goodput: str | None
    repeats: int | None
    warmup: int | None
    plot: Path | None

    def prompt_set(self) -> list[datasets.Prompt]:
        """--prompts read (the held-out prompts shipped with the package without it), unshortened."""
        return dataset(self.prompts, self.dataset_format, None, self.output_len, self.seed, default=default_prompts())

    def load(self) -> dict:
        """:func:`loadgen.run`'s load and request options (bad --request-rate or --goodput refused here)."""
        from dflash_trt.bench import load as loads  # start-up: asyncio and ssl (the load generator, ~0.1 s)

        return {
            "request_rate": rates(self.request_rate),
            "burstiness": self.burstiness,
            "duration": self.duration,
            "goodput": loads.parse_goodput(self.goodput),
            "seed": self.seed or 0,
            "repeats": self.repeats or 3,
            "warmup": self.warmup,
            "requests": self.requests,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "chat": self.chat,
            "ignore_eos": self.ignore_eos,
        }


def bench(
    bundle: BundleArg = None,
    target: TargetOpt = None,
    drafter: DrafterOpt = None,
    prompts: PromptsOpt = None,
    dataset_format: DatasetFormatOpt = "auto",
    input_len: InputLenOpt = None,
    output_len: OutputLenOpt = None,
    seed: SeedOpt = None,
    max_tokens: MaxTokensOpt = 128,
    block_size: BlockSizeOpt = None,
    chat: ChatOpt = False,
    dtype: DtypeOpt = "auto",
    kernels: KernelsOpt = "lean",
    backend: BackendOpt = "torch",
    as_json: JsonOpt = False,
    endpoint: EndpointOpt = None,
    baseline: BaselineOpt = None,
    mtp_endpoint: MtpEndpointOpt = None,
    model: ModelOpt = None,
    concurrency: ConcurrencyOpt = None,
    requests: RequestsOpt = None,
    temperature: TemperatureOpt = 0.0,
    ignore_eos: IgnoreEosOpt = False,
    request_rate: RequestRateOpt = None,
    burstiness: BurstinessOpt = 1.0,
    duration: DurationOpt = None,
    goodput: GoodputOpt = None,
    repeats: RepeatsOpt = None,
    warmup: WarmupOpt = None,
    plot: PlotOpt = None,
) -> None:
    """Measure τ, per-position acceptance and speedup over autoregressive decoding, and check losslessness.

    With --endpoint URL: drive any OpenAI-compatible server (trtllm-serve, vLLM, SGLang, 'dflash-trt serve')
    and report per concurrency output tokens/s, tokens/s per user, TTFT, ITL and τ when the server reports it.
    """
    opts = BenchOptions(**locals())  # first statement: locals() is exactly the parameters
    if endpoint is not None:
        return bench_endpoint(opts, endpoint)
    check_refs(target, drafter, True, bundle)  # before the runtime (torch) loads
    rows = opts.prompt_set()
    if baseline is not None or plot is not None or mtp_endpoint is not None or request_rate is not None:
        raise DFlashError("--baseline, --mtp-endpoint, --request-rate and --plot go with --endpoint URL")
    pair = load_pair_from(target, drafter, dtype, bundle=bundle, kernels=kernels, backend=backend)
    _bench_inprocess(pair, rows, opts)


def _bench_inprocess(pair, rows: list[datasets.Prompt], opts: BenchOptions) -> None:
    """The prompts cut to the pair's context, run DFlash vs autoregressive in-process, reported."""
    from dflash_trt.bench import inprocess  # start-up: torch (the reference runtime)

    max_tokens, chat = opts.max_tokens, opts.chat
    context = context_len(pair, opts.bundle)
    if opts.input_len is not None:
        rows = datasets.cut(rows, opts.input_len, pair.tokenizer)
    elif opts.prompts is None:  # the shipped prompts fit any bundle: cut to its context (a user's file is refused)
        room = context - max_tokens - (64 if chat else 0)  # the chat template's own tokens
        if room < 1:
            raise DFlashError(
                f"--max-tokens {max_tokens} leaves no room for a prompt in this model's context of {context} tokens"
            )
        rows = datasets.cut(rows, room, pair.tokenizer)
    with steps("prompts", len(rows) * (opts.repeats or 1)) as step:
        report = inprocess.run(
            pair,
            rows,
            max_new_tokens=max_tokens,
            block_size=opts.block_size,
            chat=chat,
            repeats=opts.repeats or 1,
            progress=step,
            context=context,
        )
    if opts.as_json:
        print_json(report)
        return
    show(report)


def planned_curve(bundle) -> tuple[list[dict] | None, int, str | None]:
    """A bundle's predicted curves (``plan.predicted``), the GPUs one server uses (its tp) and
    the device it was planned for (``plan.gpu``: a GPU model, or cpu; None without a bundle)."""
    if bundle is None:
        return None, 1, None
    plan = ingest.open_bundle(bundle).manifest.plan
    if plan is None:
        return None, 1, None
    rows = [r.model_dump(mode="json", exclude_unset=True) for r in plan.predicted]  # the plot reads JSON rows
    return rows or None, plan.tp, plan.gpu


def refuse_gate(bundle) -> None:
    """A bundle whose config sets TensorRT-LLM's speculation gate is not measured (``deploy.speculation_gate``)."""
    from dflash_trt import deploy  # start-up: the pipeline (~0.1 s), loaded by the commands that use it

    path = None if bundle is None else Path(bundle) / ingest.Layout.TRTLLM_CONFIG
    if path is None or not path.is_file():
        return
    try:
        gate = deploy.speculation_gate(yaml.safe_load(path.read_text()))
    except yaml.YAMLError:
        return  # what the config holds is the bundle check's to say
    if gate:
        raise DFlashError(f"{path}: {gate}")


def bench_endpoint(opts: BenchOptions, endpoint: str) -> None:
    """--endpoint: the server (and --baseline, --mtp-endpoint) driven at each level, then reported."""
    from dflash_trt.bench import endpoint as loadgen  # start-up: asyncio and ssl (the load generator, ~0.1 s)

    if opts.backend != "torch":
        raise DFlashError("--backend runs the models in-process; with --endpoint the server runs them")
    rows = opts.prompt_set() if opts.prompts else None  # None: the load generator's own prompts
    load = opts.load()
    levels = _levels(opts.concurrency, load["request_rate"])
    if opts.input_len is not None:
        prompts = rows or [datasets.Prompt(t) for t in loadgen.PROMPTS]
        rows = datasets.cut(prompts, opts.input_len, _tokenizer(opts.bundle))
    refuse_gate(opts.bundle)
    n = (len(levels) + len(load["request_rate"])) * (1 + bool(opts.baseline) + bool(opts.mtp_endpoint))
    with steps("benchmarking", n) as step:
        report = loadgen.run(
            endpoint,
            model=opts.model,
            baseline=opts.baseline,
            mtp=opts.mtp_endpoint,
            prompts=rows,
            concurrency=levels,
            records=opts.as_json,
            **load,
            progress=lambda url, c: step(desc=f"benchmarking: {url} {_label(c)} done"),
        )
    _report_endpoint(report, opts.bundle, opts.plot, opts.as_json)


def _levels(concurrency: str | None, request_rate: list[float]) -> list[int]:
    """--concurrency as closed-loop levels (default 1,4,16,32; none when only --request-rate is given)."""
    if concurrency is None:
        concurrency = "" if request_rate else "1,4,16,32"  # --request-rate alone: open loop only
    try:
        return [int(x) for x in concurrency.split(",") if x.strip()]
    except ValueError:
        raise DFlashError(f"--concurrency {concurrency!r}: expected comma-separated integers, e.g. 1,4,16,32") from None


def _report_endpoint(report: dict, bundle: str | None, plot: Path | None, as_json: bool) -> None:
    """The endpoint report saved and plotted at --plot (the results first), then printed; a plot
    the filesystem refused is one line raised after the results are out."""
    refused = None
    if plot is not None:  # the results are saved (PLOT.json) before the figure is drawn
        predicted, gpus, device = planned_curve(bundle)
        refused = save_then_plot(
            report,
            plot,
            lambda p: plots.plot(
                report, p, predicted=predicted, gpus=gpus, device=device, name=Path(bundle).name if bundle else None
            ),
        )
        report["plot"] = None if refused else str(plot)
    if as_json:
        print_json(report)
    else:
        show_endpoint(report)
    if refused:
        raise DFlashError(refused)


def _label(c) -> str:
    return f"concurrency {c}" if isinstance(c, int) else str(c)


def _tokenizer(bundle):
    """The bundle's target tokenizer (None without a bundle: --input-len then counts words)."""
    if bundle is None:
        return None
    from dflash_trt.runtime import load_tokenizer  # start-up: torch (the runtime face loads it)

    return load_tokenizer(ingest.open_bundle(bundle).target)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
