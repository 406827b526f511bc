"""dflash-trt train-drafter: train a DFlash or DFlash2 drafter for any transformers causal LM."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dflash_trt._cli.common import JsonOpt, err, out, print_json


def _layer_ids(value: str | None) -> list[int] | None:
    from dflash_trt.errors import DFlashError

    if value is None:
        return None
    try:
        ids = [int(x) for x in value.replace(",", " ").split()]
    except ValueError:
        raise DFlashError(f"--target-layer-ids {value!r}: expected integers like 1,3,5") from None
    if not ids:
        raise DFlashError("--target-layer-ids: give at least one layer id")
    return ids


def train_drafter(
    target: Annotated[str, typer.Option(
        "--target", "-t", help="Target: local Hugging Face directory, hub id, or embedded:NAME "
                             "(embedded:tiny/target).")],
    data: Annotated[str, typer.Option(
        "--data", help="Prompts: JSONL with 'prompt', a text file, or a folder of text files (cut into prompts).")],
    out_dir: Annotated[Path, typer.Option(
        "--out", "-o", help="Output directory: the z-lab drafter, plus .train/ (checkpoint, regenerated data).")],
    block_size: Annotated[int | None, typer.Option(
        "--block-size", "-b", min=2, help="Block size B (anchor + B-1 drafts). Default 8.")] = None,
    layers: Annotated[int | None, typer.Option(
        "--layers", min=1, help="Drafter decoder layers. Default 1 (z-lab uses 5 for 8B targets).")] = None,
    target_layer_ids: Annotated[str | None, typer.Option(
        "--target-layer-ids", help="Tapped target layers, e.g. 1,9,17,25,33 (z-lab ids: output of layer i). Default: "
                                   "spread from 1 to depth-3.")] = None,
    mask_token_id: Annotated[int | None, typer.Option(
        "--mask-token-id", min=0, help="Embedding row used as MASK. Default: the tokenizer's mask token, else the "
                                       "first spare row.")] = None,
    arch: Annotated[str | None, typer.Option(
        "--arch", help="Drafter: dflash (DFlashDraftModel) or dflash2 (DFlash2DraftModel: dynamic convolutions around "
                       "every sublayer and a candidate selector, trained with the same block objective). "
                       "Default dflash.")] = None,
    conv_kernel_size: Annotated[int | None, typer.Option(
        "--conv-kernel-size", min=1, help="DFlash2: taps of each dynamic convolution. Default 2.")] = None,
    conv_group_size: Annotated[int | None, typer.Option(
        "--conv-group-size", min=1,
        help="DFlash2: channels sharing one dynamic tap (divides the hidden size). Default 16.")] = None,
    selector_rank: Annotated[int | None, typer.Option(
        "--selector-rank", min=1, help="DFlash2: rank of the selector's codebooks. Default 256.")] = None,
    selector_top_k: Annotated[int | None, typer.Option(
        "--selector-top-k", min=2,
        help="DFlash2: candidates per block position the selector chooses among. Default 16.")] = None,
    steps: Annotated[int, typer.Option(
        "--steps", min=1, help="Total optimizer steps (with --resume: continue up to this).")] = 1000,
    batch_size: Annotated[int, typer.Option(
        "--batch-size", min=1, help="Sequences per step (the global batch, over all ranks).")] = 8,
    anchors: Annotated[int, typer.Option(
        "--anchors", min=1, help="Random anchor positions (blocks) per sequence.")] = 16,
    lr: Annotated[float, typer.Option(
        "--lr", min=0.0, help="AdamW peak learning rate (linear warm-up, cosine decay to 10%).")] = 6e-4,
    prompt_len: Annotated[int, typer.Option("--prompt-len", min=2, help="Prompt tokens per training sequence.")] = 64,
    gen_len: Annotated[int, typer.Option(
        "--gen-len", min=1, help="Response tokens the target regenerates per prompt.")] = 128,
    window_stride: Annotated[int | None, typer.Option(
        "--window-stride", min=1, help="Text data: a prompt window starts every N tokens. Default --prompt-len + "
                                       "--gen-len (windows never overlap the text they continue); smaller draws more "
                                       "prompts from a small corpus.")] = None,
    samples: Annotated[int, typer.Option("--samples", min=1, help="Training sequences to regenerate.")] = 1024,
    eval_every: Annotated[int, typer.Option(
        "--eval-every", min=1, help="Steps between held-out τ measurements.")] = 100,
    eval_data: Annotated[str | None, typer.Option(
        "--eval-data", help="Held-out τ on prompts cut from this data (JSONL or text, as --data), e.g. files kept "
                            "out of training. Default: 8 windows held back from --data, which share its files and "
                            "read higher than `dflash-trt bench` on held-out prompts.")] = None,
    save_every: Annotated[int, typer.Option("--save-every", min=1, help="Steps between checkpoints.")] = 100,
    seed: Annotated[int, typer.Option("--seed", help="Seed for data order, anchors and initialisation.")] = 0,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run saved in --out.")] = False,
    chat_template: Annotated[bool, typer.Option(
        "--chat-template",
        help="Format JSONL prompts with the target's chat template (lines with 'messages' always are).")] = False,
    thinking: Annotated[bool | None, typer.Option(
        "--thinking/--no-thinking", help="The chat template's enable_thinking (Qwen3); recorded in training.json. "
                                         "Default: the template's own.")] = None,
    regen_endpoint: Annotated[str | None, typer.Option(
        "--regen-endpoint", help="OpenAI-compatible server (trtllm-serve, vLLM, SGLang, dflash-trt serve) that "
                                 "regenerates the responses. Default: the reference runtime in this process.")] = None,
    regen_model: Annotated[str | None, typer.Option(
        "--regen-model", help="Model name to ask --regen-endpoint for. Default: the first it lists.")] = None,
    regen_concurrency: Annotated[int, typer.Option(
        "--regen-concurrency", min=1, help="Requests in flight to --regen-endpoint, per rank; without an "
                                           "endpoint, rows per batch of the in-process regeneration.")] = 32,
    feature_cache: Annotated[Path | None, typer.Option(
        "--feature-cache", help="Feature folder: the target's hidden states as safetensors shards "
                                "(docs/guides/train.md: 'The feature folder'), written once by this run or converted "
                                "from a serving engine's "
                                "capture, checked, then read by every step and rank. Default: online.")] = None,
    feature_shard_mb: Annotated[float, typer.Option(
        "--feature-shard-mb", min=0.001, help="Size of one --feature-cache shard, in MB.")] = 1024.0,
    nproc: Annotated[int, typer.Option("--nproc", min=1, help="Data-parallel ranks on this machine, started with "
                                                              "torch's launcher (torchrun). The batch is global.")] = 1,
    parallel: Annotated[str, typer.Option(
        "--parallel", help="torch's engine over the ranks: fsdp (FSDP2: drafter, its AdamW state and the target's "
                           "decoder layers sharded), ddp (whole copies, gradients all-reduced) or none (one process). "
                           "Default auto: fsdp with several ranks, none alone.")] = "auto",
    target_dtype: Annotated[str, typer.Option(
        "--target-dtype", help="Precision of the frozen target: bfloat16, float16, float32, or auto (as it ships; "
                               "bfloat16 when its config names none).")] = "auto",
    as_json: JsonOpt = False,
) -> None:
    # One line: typer lists a command by its docstring's first line.
    """Train a DFlash (or, with --arch dflash2, a DFlash2) drafter: target-regenerated responses, random anchors, block masks, decayed loss."""  # noqa: E501
    from dflash_trt.train import TrainSettings, launch

    settings = TrainSettings(
        target=target, data=data, out=str(out_dir), block_size=block_size, layers=layers,
        target_layer_ids=_layer_ids(target_layer_ids), mask_token_id=mask_token_id, arch=arch,
        conv_kernel_size=conv_kernel_size, conv_group_size=conv_group_size, selector_rank=selector_rank,
        selector_top_k=selector_top_k, steps=steps,
        batch_size=batch_size, anchors=anchors, lr=lr, prompt_len=prompt_len, gen_len=gen_len,
        window_stride=window_stride, samples=samples, eval_every=eval_every, eval_data=eval_data,
        save_every=save_every, seed=seed,
        resume=resume,
        chat_template=chat_template, thinking=thinking, regen_endpoint=regen_endpoint, regen_model=regen_model,
        regen_concurrency=regen_concurrency, feature_cache=None if feature_cache is None else str(feature_cache),
        feature_shard_mb=feature_shard_mb, parallel=parallel, target_dtype=target_dtype,
    )
    result = launch(settings, nproc) if nproc > 1 else _run_with_bars(settings)
    summary = _summary(result)
    if as_json:
        print_json(summary)
        return
    held = "n/a" if result.heldout_tau is None else f"{result.heldout_tau:.2f}"
    out.print(f"drafter written to {result.out} (step {result.step}, loss {summary['loss']}, held-out τ {held})")


def _run_with_bars(settings):
    """Train, one progress bar per phase on stderr (loss, τ and the last held-out τ beside it)."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    from rich.progress import Progress as Bar

    from dflash_trt.train import Progress
    from dflash_trt.train import train_drafter as run

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Bar(*columns, console=err, transient=False) as bar:
        state = {"task": None, "heldout": ""}

        def phase(name: str, total: int) -> None:
            if state["task"] is not None:
                bar.stop_task(state["task"])
            state["task"] = bar.add_task(name, total=total, info="")

        def advance(done: int, info: dict) -> None:
            if "heldout_tau" in info:
                state["heldout"] = f" held-out τ {info['heldout_tau']:.2f}"
            text = f"loss {info['loss']:.3f} τ {info['tau']:.2f}{state['heldout']}" if "loss" in info else ""
            if state["task"] is not None:
                bar.update(state["task"], completed=done, info=text)

        return run(settings, Progress(phase=phase, advance=advance, log=lambda line: bar.console.print(line)))


def _summary(result) -> dict:
    """The --json object (NaN losses, e.g. before the first step, become null)."""
    def num(x, nd):
        return None if x is None or x != x else round(x, nd)

    return {"out": str(result.out), "step": result.step, "loss": num(result.loss, 4),
            "train_tau": num(result.train_tau, 3),
            "heldout_tau": None if result.heldout_tau is None else round(result.heldout_tau, 3),
            "seconds": round(result.seconds, 1), "history": result.history}


def register(app: typer.Typer) -> None:
    app.command("train-drafter")(train_drafter)
