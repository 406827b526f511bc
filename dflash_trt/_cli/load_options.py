"""The options every measuring command spells alike (bench, tune, verify): prompts and their
lengths, repeats and warm-up, and open-loop load. One spelling per idea: ``--max-tokens``/``-n``
for tokens per request, ``--prompts`` for a prompt set, ``--concurrency`` for closed-loop levels."""

from __future__ import annotations

from typing import Annotated

import typer

from dflash_trt.bench import datasets
from dflash_trt.errors import DFlashError
from dflash_trt.plan import MAX_TOKENS

# Upper bounds, so a hostile count is one line at the door, never a run that does not end
# (token counts: the recipes' own range, plan.MAX_TOKENS).
MAX_REPEATS = 100
MAX_REQUESTS = 1 << 20

PromptsOpt = Annotated[
    str | None,
    typer.Option(
        "--prompts",
        help="Prompt set: a file (one prompt per line; the project's JSONL with 'prompt' and an optional "
        "'category'; ShareGPT JSON/JSONL) or hf:NAME[:SPLIT] (needs the 'datasets' package). Default: "
        "the prompts shipped with the package.",
    ),
]
DatasetFormatOpt = Annotated[
    str, typer.Option("--dataset-format", help="Format of --prompts: auto, jsonl, sharegpt or text.")
]
InputLenOpt = Annotated[
    int | None,
    typer.Option(
        "--input-len",
        min=1,
        max=MAX_TOKENS,
        help="Cut every prompt to this many tokens (the bundle's tokenizer where known, else words).",
    ),
]
OutputLenOpt = Annotated[
    int | None,
    typer.Option(
        "--output-len",
        min=1,
        max=MAX_TOKENS,
        help="Tokens every request asks for, over a record's own (ShareGPT: its reply's length) and --max-tokens.",
    ),
]
SeedOpt = Annotated[
    int | None,
    typer.Option(
        "--seed",
        help="Shuffle the prompts with this seed (and draw open-loop arrivals with it); default: file order, "
        "arrival seed 0.",
    ),
]
MaxTokensOpt = Annotated[
    int, typer.Option("--max-tokens", "-n", min=1, max=MAX_TOKENS, help="Tokens per request at most.")
]
RepeatsOpt = Annotated[
    int | None,
    typer.Option(
        "--repeats",
        min=1,
        max=MAX_REPEATS,
        help="Measured passes per level (default 3; in-process bench 1); figures carry their "
        "min–max over them, and a conclusion (drafting pays, a winner, a schedule step) needs "
        "intervals that do not overlap and means more than 5% apart.",
    ),
]
WarmupOpt = Annotated[
    int | None,
    typer.Option(
        "--warmup",
        min=0,
        max=MAX_REQUESTS,
        help="Requests sent before each level, not counted (default: one per concurrent request).",
    ),
]
RequestRateOpt = Annotated[
    str | None,
    typer.Option(
        "--request-rate",
        help="With --endpoint: open-loop levels, requests per second, comma-separated (Poisson "
        "arrivals; see --burstiness), measured beside the --concurrency levels.",
    ),
]
BurstinessOpt = Annotated[
    float,
    typer.Option(
        "--burstiness",
        help="Open-loop arrival gaps ~ Gamma(shape=burstiness): 1 Poisson, <1 burstier, >1 steadier, inf a fixed rate.",
    ),
]
DurationOpt = Annotated[
    float | None,
    typer.Option(
        "--duration",
        help="With --endpoint: end each level after this many seconds of sending (with --requests: "
        "whichever comes first).",
    ),
]
GoodputOpt = Annotated[
    str | None,
    typer.Option(
        "--goodput",
        help="With --endpoint: report goodput, completed requests per second within these limits in ms, "
        "e.g. ttft:500,tpot:50 (keys ttft, tpot, e2el).",
    ),
]


def rates(text: str | None) -> list[float]:
    if not text:
        return []
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DFlashError(f"--request-rate {text!r}: expected comma-separated numbers, e.g. 1,2,4") from None
    if not vals or min(vals) <= 0:
        raise DFlashError("--request-rate needs positive numbers (requests per second)")
    return vals


def dataset(
    prompts: str | None,
    fmt: str,
    input_len: int | None,
    output_len: int | None,
    seed: int | None,
    tokenizer=None,
    default: str | None = None,
):
    """The prompt set as :class:`dflash_trt.bench.datasets.Prompt` (``default`` when no --prompts;
    None when neither)."""
    source = prompts or default
    if source is None:
        return None
    return datasets.load(
        source, fmt if prompts else "auto", input_len=input_len, output_len=output_len, seed=seed, tokenizer=tokenizer
    )
