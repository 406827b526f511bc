"""dflash-trt generate: one prompt through the reference runtime, with statistics."""

from __future__ import annotations

import contextlib
import logging
from typing import Annotated

import typer

from dflash_trt import ingest
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
    err,
    load_pair_from,
    out,
    print_json,
)
from dflash_trt.errors import DFlashError


def generate(
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="Prompt text.")],
    bundle: BundleArg = None,
    target: TargetOpt = None,
    drafter: DrafterOpt = None,
    max_new_tokens: Annotated[int, typer.Option("--max-tokens", "-n", min=0, help="Tokens to generate at most.")] = 128,
    temperature: Annotated[
        float, typer.Option(min=0.0, help="0 is greedy (lossless: identical to the target's own greedy output).")
    ] = 0.0,
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass in (0, 1].")] = 1.0,
    top_k: Annotated[int, typer.Option("--top-k", min=0, help="Keep the k most likely tokens (0: all).")] = 0,
    seed: Annotated[int | None, typer.Option(help="Random seed for sampling.")] = None,
    block_size: BlockSizeOpt = None,
    chat: Annotated[bool, typer.Option("--chat", help="Wrap the prompt in the tokenizer's chat template.")] = False,
    dtype: DtypeOpt = "auto",
    kernels: KernelsOpt = "lean",
    backend: BackendOpt = "torch",
    as_json: JsonOpt = False,
) -> None:
    """Generate text with DFlash speculative decoding and print acceptance statistics."""
    check_refs(target, drafter, block_size != 1, bundle)  # before the runtime (torch) loads
    from dflash_trt.runtime import SamplingParams  # start-up: torch (after check_refs: a bad path is one line)
    from dflash_trt.runtime import generate as run  # start-up: torch

    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    pair = load_pair_from(
        target, drafter, dtype, need_drafter=block_size != 1, bundle=bundle, kernels=kernels, backend=backend
    )
    ids = _encode(pair, prompt, chat)
    check_context(len(ids), max_new_tokens, context_len(pair, bundle))
    drafter_model = pair.drafter if block_size != 1 else None
    res = run(
        pair.target,
        drafter_model,
        [ids],
        max_new_tokens=max_new_tokens,
        sampling=params,
        block_size=block_size,
        stop_token_ids=pair.stop_token_ids,
        backend=pair.backend,
    )
    _show_generated(res, pair.decode(res.token_ids[0]), as_json)


def _encode(pair, prompt: str, chat: bool) -> list[int]:
    """--prompt as token ids; text the tokenizer cannot take (a lone surrogate, ...) is one line."""
    with _quiet("transformers"):  # its "longer than the maximum" warning: check_context says it in one line
        try:
            return pair.encode(prompt, chat=chat)
        except (UnicodeError, TypeError, ValueError) as exc:  # a lone surrogate, ...
            raise DFlashError(f"--prompt cannot be tokenized ({type(exc).__name__}: {exc})") from None


def _show_generated(res, text: str, as_json: bool) -> None:
    """The text on stdout and its statistics on stderr, or one JSON object of both."""
    tokens, s = res.token_ids[0], res.stats
    if as_json:
        print_json(
            {
                "text": text,
                "token_ids": tokens,
                "finish_reason": res.finish_reasons[0],
                **s.as_dict(),
            }
        )
        return
    out.print(text, markup=False)
    per_pos = " ".join(f"{x:.2f}" for x in s.per_position_acceptance)
    err.print(
        f"[dim]{s.new_tokens} tokens, τ {s.acceptance_length:.2f} (B={s.block_size}), "
        f"{s.target_forwards} target forwards, {s.tokens_per_second:.1f} tok/s; "
        f"per-position acceptance [{per_pos}][/dim]"
    )


@contextlib.contextmanager
def _quiet(logger: str):
    lg = logging.getLogger(logger)
    level = lg.level
    lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        lg.setLevel(level)


def context_len(pair, bundle: str | None) -> int:
    """The context the server would serve this pair with: the bundle's planned ``max_seq_len``,
    else the model's ``max_position_embeddings`` (serve/app.py's rule)."""
    if bundle is not None:
        planned = ingest.open_bundle(bundle).serve.max_seq_len
        if planned:
            return int(planned)
    return int(getattr(pair.target.config, "max_position_embeddings", 0) or 4096)


def check_context(n: int, max_new: int, ctx: int) -> None:
    """The server's refusals (``serve.routes.make_job``), as one line: an empty prompt, a prompt that
    fills the context, a prompt plus -n past it."""
    if n == 0:
        raise DFlashError("the prompt is empty (0 tokens)")
    if n >= ctx:
        raise DFlashError(f"the prompt has {n} tokens; this model's context is {ctx} tokens")
    if n + max_new > ctx:
        raise DFlashError(
            f"prompt ({n} tokens) + --max-tokens ({max_new}) exceeds this model's context of "
            f"{ctx} tokens; pass -n {ctx - n} or less"
        )


def register(app: typer.Typer) -> None:
    app.command("generate")(generate)
