"""dflash-trt bench: DFlash vs autoregressive on the reference runtime, same process."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.progress import Progress
from rich.table import Table

from dflash_trt._cli.common import (DrafterOpt, DtypeOpt, JsonOpt, TargetOpt, default_prompts, err, load_pair_from,
                                    out, print_json)


def bench(
    target: TargetOpt = None,
    drafter: DrafterOpt = None,
    prompts: Annotated[Optional[str], typer.Option("--prompts", help="Prompts file: one per line, or JSONL with 'prompt'.")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", min=1, help="Tokens per prompt at most.")] = 128,
    block_size: Annotated[Optional[int], typer.Option("--block-size", "-b", min=2, help="Draft block size B (default: the drafter's).")] = None,
    chat: Annotated[bool, typer.Option("--chat", help="Wrap prompts in the chat template.")] = False,
    dtype: DtypeOpt = "auto",
    as_json: JsonOpt = False,
) -> None:
    """Measure τ, per-position acceptance and speedup over autoregressive decoding, and check losslessness."""
    from dflash_trt import bench as b
    from dflash_trt.errors import DFlashError

    if prompts is None:
        if target is not None:
            raise DFlashError("no prompts: pass --prompts FILE (one prompt per line, or JSONL with 'prompt')")
        prompts = default_prompts()          # the embedded pair's held-out standard-library prompts
    texts = b.read_prompts(prompts)
    pair = load_pair_from(target, drafter, dtype)
    with Progress(console=err, transient=True) as bar:
        task = bar.add_task("prompts", total=len(texts))
        report = b.run(pair, texts, max_new_tokens=max_new_tokens, block_size=block_size, chat=chat,
                       progress=lambda k: bar.update(task, completed=k))
    if as_json:
        print_json(report)
        return
    show(report)


def show(r: dict) -> None:
    t = Table(title=f"DFlash vs autoregressive — {r['prompts']} prompts, B={r['block_size']}, greedy")
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


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
