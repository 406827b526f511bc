"""In-process benchmark: DFlash against plain autoregressive decoding, same process, same prompts.

Both runs go through :func:`dflash_trt.runtime.generate` (block size B vs 1), greedy, one
prompt at a time, after a warm-up of each, and through the same backend (the pair's: the
PyTorch modules, or a bundle's graphs under ONNX Runtime or TensorRT), ``repeats`` times.
Reported: τ and per-position acceptance, tokens/s of each and their ratio (``speedup``: DFlash
tokens/s over autoregressive tokens/s) with its interval over repeats and a verdict ("pays" only
beyond it, :mod:`dflash_trt.bench.spread`; one repeat has no spread), TTFT, TPOT and end-to-end
latency per prompt (:mod:`dflash_trt.bench.latency`: the first token at the end of prefill),
``lossless`` (every DFlash output equals the autoregressive one, on every repeat), and where a
DFlash step's time goes (``step_cost_ratio``: one draft + verify step over one verify forward
on the same block).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dflash_trt.bench import datasets, spread
from dflash_trt.bench.datasets import Prompt
from dflash_trt.bench.latency import Record, summarize
from dflash_trt.errors import DFlashError
from dflash_trt.runtime import Pair, Stats, generate


def read_prompts(path: str | Path) -> list[str]:
    """The prompt texts of a file in any format :mod:`dflash_trt.bench.datasets` reads (one per
    line, the project's JSONL, ShareGPT)."""
    return [p.text for p in datasets.load(path)]


def _merge(stats: list[Stats]) -> dict:
    B = stats[0].block_size
    total = Stats(block_size=B, accepted_at=[0] * (B - 1))
    for s in stats:
        total.rounds += s.rounds
        total.committed += s.committed
        total.target_forwards += s.target_forwards
        total.prompt_tokens += s.prompt_tokens
        total.new_tokens += s.new_tokens
        total.seconds += s.seconds
        total.prefill_seconds += s.prefill_seconds
        total.draft_seconds += s.draft_seconds
        total.verify_seconds += s.verify_seconds
        total.accepted_at = [a + b for a, b in zip(total.accepted_at, s.accepted_at, strict=True)]
    return total.as_dict()


def _record(stats: Stats) -> Record:
    """One prompt's timing as a latency record: the first token at the end of prefill, the rest
    when the call returned (the runtime counts its tokens exactly)."""
    chunks = [(stats.prefill_seconds, 1)]
    if stats.new_tokens > 1:
        chunks.append((stats.seconds, stats.new_tokens - 1))
    return Record(ok=True, chunks=chunks if stats.new_tokens else [], e2el=stats.seconds, tokens_from="runtime")


def _latency(stats: list[Stats]) -> dict:
    s = summarize([_record(x) for x in stats], sum(x.seconds for x in stats))
    return {
        k: s[k]
        for k in ("ttft_ms", "tpot_ms", "e2el_ms", "tokens_per_second_per_user", "tokens_per_second_per_user_with_ttft")
    }


def _one_pass(
    pair: Pair, encoded: list, B: int, lengths: list[int], progress, done: int
) -> tuple[list[Stats], list[Stats], list[int]]:
    """Every prompt through DFlash, then through autoregressive decoding, back to back."""
    be, stops = pair.backend, pair.stop_token_ids
    ds, ars, mismatches = [], [], []
    for k, (ids, max_new_tokens) in enumerate(zip(encoded, lengths, strict=True)):
        d = generate(
            pair.target,
            pair.drafter,
            [ids],
            max_new_tokens=max_new_tokens,
            block_size=B,
            stop_token_ids=stops,
            backend=be,
        )
        a = generate(
            pair.target, None, [ids], max_new_tokens=max_new_tokens, block_size=1, stop_token_ids=stops, backend=be
        )
        ds.append(d.stats)
        ars.append(a.stats)
        if d.token_ids != a.token_ids:
            mismatches.append(k)
        if progress:
            progress(done + k + 1)
    return ds, ars, mismatches


def _speed(passes: list[tuple[list[Stats], list[Stats]]], dflash: dict, ar: dict) -> dict:
    """The speedup (DFlash tokens/s over autoregressive tokens/s, all repeats), its interval over
    repeats and whether DFlash pays beyond it."""
    rate = lambda ss: sum(x.new_tokens for x in ss) / max(sum(x.seconds for x in ss), 1e-12)  # noqa: E731
    d_iv = spread.interval([rate(d) for d, _ in passes])
    a_iv = spread.interval([rate(a) for _, a in passes])
    assert d_iv is not None and a_iv is not None  # run() refuses fewer than one repeat
    d_iv, a_iv = {**d_iv, "mean": dflash["tokens_per_second"]}, {**a_iv, "mean": ar["tokens_per_second"]}
    verdict = {"higher": "pays", "lower": "does not pay"}.get(spread.verdict(d_iv, a_iv), "indistinguishable")
    return {
        "tokens_per_second": {"dflash": d_iv, "autoregressive": a_iv},
        "speedup": spread.ratio(d_iv, a_iv),
        "verdict": verdict,
        "noisy": spread.noisy(d_iv) or spread.noisy(a_iv),
    }


def _categories(rows: list[Prompt], passes: list[tuple[list[Stats], list[Stats]]]) -> dict | None:
    """Per prompt category: τ, and the speedup (DFlash tokens/s over autoregressive tokens/s)."""
    cats = sorted({p.category for p in rows if p.category is not None})
    if not cats:
        return None
    out = {}
    for c in cats:
        idx = [i for i, p in enumerate(rows) if p.category == c]
        d = [ds[i] for ds, _ in passes for i in idx]
        a = [ars[i] for _, ars in passes for i in idx]
        dm, am = _merge(d), _merge(a)
        out[c] = {
            "prompts": len(idx),
            "acceptance_length": dm["acceptance_length"],
            "speedup": round(dm["tokens_per_second"] / am["tokens_per_second"], 4) if am["tokens_per_second"] else None,
        }
    return out


def _encoded(
    pair: Pair, rows: list[Prompt], max_new_tokens: int, chat: bool, context: int | None
) -> tuple[list[list[int]], list[int]]:
    """Each prompt's token ids and new-token budget; an empty prompt, or one past ``context``, refused."""
    encoded = [pair.encode(p.text, chat=chat) for p in rows]
    lengths = [p.max_tokens or max_new_tokens for p in rows]
    for k, (ids, n) in enumerate(zip(encoded, lengths, strict=True)):
        if not ids:
            raise DFlashError(f"--prompts: prompt {k + 1} is empty (0 tokens)")
        if context is not None and len(ids) + n > context:
            raise DFlashError(
                f"--prompts: prompt {k + 1} has {len(ids)} tokens; with --max-tokens {n} it passes "
                f"this model's context of {context} tokens"
            )
    return encoded, lengths


def _step(dflash: dict, ar: dict) -> dict:
    """Mean milliseconds per round: draft, verify, an autoregressive forward, and the step's cost ratio."""
    ar_forward = ar["verify_seconds"] / max(1, ar["rounds"])
    verify = dflash["verify_seconds"] / max(1, dflash["rounds"])
    draft = dflash["draft_seconds"] / max(1, dflash["rounds"])
    return {
        "draft_ms": round(1e3 * draft, 3),
        "verify_ms": round(1e3 * verify, 3),
        "autoregressive_forward_ms": round(1e3 * ar_forward, 3),
        "step_cost_ratio": round((draft + verify) / verify, 4) if verify else None,
    }


def run(
    pair: Pair,
    prompts: list[str] | list[Prompt],
    *,
    max_new_tokens: int = 128,
    block_size: int | None = None,
    chat: bool = False,
    repeats: int = 1,
    progress: Callable[[int], None] | None = None,
    context: int | None = None,
) -> dict:
    """Both arms over every prompt, ``repeats`` times after a warm-up of each (``progress(n)``:
    prompts done over all repeats). A :class:`Prompt`'s own ``max_tokens`` wins over
    ``max_new_tokens``; its ``category`` gives τ and speedup per category. ``context``: the tokens
    a prompt plus its new tokens may hold (a prompt past it is refused before any generation)."""
    if pair.drafter is None:
        raise DFlashError("bench needs a drafter")
    if repeats < 1:
        raise DFlashError("--repeats must be >= 1")
    B = pair.block_size(block_size)
    rows = [p if isinstance(p, Prompt) else Prompt(p) for p in prompts]
    encoded, lengths = _encoded(pair, rows, max_new_tokens, chat, context)
    stops = pair.stop_token_ids
    # Warm-up both paths (allocator, kernels, first-call overheads). Both run through the pair's
    # backend (None: the PyTorch modules), so the speedup compares like with like.
    be = pair.backend
    generate(pair.target, pair.drafter, [encoded[0]], max_new_tokens=8, block_size=B, stop_token_ids=stops, backend=be)
    generate(pair.target, None, [encoded[0]], max_new_tokens=8, block_size=1, stop_token_ids=stops, backend=be)
    passes, mismatches = [], set()
    for r in range(repeats):
        ds, ars, bad = _one_pass(pair, encoded, B, lengths, progress, r * len(encoded))
        passes.append((ds, ars))
        mismatches.update(bad)
    ds = [x for d, _ in passes for x in d]
    ars = [x for _, a in passes for x in a]
    dflash, ar = _merge(ds), _merge(ars)
    report = {
        "backend": getattr(be, "name", "torch"),
        "prompts": len(prompts),
        "repeats": repeats,
        "block_size": B,
        "max_new_tokens": max_new_tokens,
        "dflash": {**dflash, **_latency(ds)},
        "autoregressive": {**ar, **_latency(ars)},
        "acceptance_length": dflash["acceptance_length"],
        "per_position_acceptance": dflash["per_position_acceptance"],
        "speedup": round(dflash["tokens_per_second"] / ar["tokens_per_second"], 4) if ar["tokens_per_second"] else None,
        "spread": _speed(passes, dflash, ar),
        "categories": _categories(rows, passes),
        "lossless": not mismatches,
        "mismatched_prompts": sorted(mismatches),
        "step": _step(dflash, ar),
    }
    if files := getattr(be, "files", None):  # a graph backend: the graph file each model call ran
        report["graphs"] = dict(files)
    return report
