"""In-process benchmark: DFlash against plain autoregressive decoding, same process, same prompts.

Both runs go through :func:`dflash_trt.runtime.generate` (block size B vs 1), greedy, one
prompt at a time, after a warm-up of each, and through the same backend (the pair's: the
PyTorch modules, or a bundle's graphs under ONNX Runtime or TensorRT). Reported: τ and per-position acceptance,
tokens/s of each and their ratio (``speedup``), ``lossless`` (every DFlash output equals
the autoregressive one), and where a DFlash step's time goes (``step_cost_ratio``: one
draft + verify step over one target forward on the same block).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from dflash_trt.errors import DFlashError, read_text
from dflash_trt.runtime import Pair, Stats, generate


def read_prompts(path: str | Path) -> list[str]:
    """One prompt per line, or JSONL objects with a 'prompt' field."""
    p = Path(path)
    if not p.exists():
        raise DFlashError(f"prompts file {p} does not exist")
    out = []
    for n, line in enumerate(read_text(p, "prompts file").splitlines(), 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DFlashError(f"{p}:{n}: invalid JSON: {exc.msg}") from None
            except RecursionError:
                raise DFlashError(f"{p}:{n}: JSON nested too deeply") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
                raise DFlashError(f"{p}:{n}: JSONL lines need a string 'prompt' field")
            if not obj["prompt"].isascii():
                try:
                    obj["prompt"].encode("utf-8")
                except UnicodeEncodeError:
                    raise DFlashError(f"{p}:{n}: the prompt is not valid text (a lone surrogate)") from None
            out.append(obj["prompt"])
        else:
            out.append(line.replace("\\n", "\n"))
    if not out:
        raise DFlashError(f"{p}: no prompts")
    return out


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


def run(pair: Pair, prompts: list[str], *, max_new_tokens: int = 128, block_size: int | None = None,
        chat: bool = False, progress: Callable[[int], None] | None = None, context: int | None = None) -> dict:
    """Each prompt through DFlash and autoregressive decoding; ``context``: the tokens a prompt plus
    ``max_new_tokens`` may hold (a prompt past it is refused before any generation)."""
    if pair.drafter is None:
        raise DFlashError("bench needs a drafter")
    B = pair.block_size(block_size)
    encoded = [pair.encode(p, chat=chat) for p in prompts]
    for k, ids in enumerate(encoded):
        if not ids:
            raise DFlashError(f"--prompts: prompt {k + 1} is empty (0 tokens)")
        if context is not None and len(ids) + max_new_tokens > context:
            raise DFlashError(f"--prompts: prompt {k + 1} has {len(ids)} tokens; with --max-new-tokens "
                              f"{max_new_tokens} it passes this model's context of {context} tokens")
    stops = pair.stop_token_ids
    # Warm-up both paths (allocator, kernels, first-call overheads). Both run through the pair's
    # backend (None: the PyTorch modules), so the speedup compares like with like.
    be = pair.backend
    generate(pair.target, pair.drafter, [encoded[0]], max_new_tokens=8, block_size=B, stop_token_ids=stops, backend=be)
    generate(pair.target, None, [encoded[0]], max_new_tokens=8, block_size=1, stop_token_ids=stops, backend=be)
    ds, ars, lossless, mismatches = [], [], True, []
    for k, ids in enumerate(encoded):
        d = generate(pair.target, pair.drafter, [ids], max_new_tokens=max_new_tokens, block_size=B,
                     stop_token_ids=stops, backend=be)
        a = generate(pair.target, None, [ids], max_new_tokens=max_new_tokens, block_size=1, stop_token_ids=stops,
                     backend=be)
        ds.append(d.stats)
        ars.append(a.stats)
        if d.token_ids != a.token_ids:
            lossless = False
            mismatches.append(k)
        if progress:
            progress(k + 1)
    dflash, ar = _merge(ds), _merge(ars)
    ar_forward = ar["verify_seconds"] / max(1, ar["rounds"])
    verify = dflash["verify_seconds"] / max(1, dflash["rounds"])
    draft = dflash["draft_seconds"] / max(1, dflash["rounds"])
    report = {
        "backend": getattr(be, "name", "torch"),
        "prompts": len(prompts),
        "block_size": B,
        "max_new_tokens": max_new_tokens,
        "dflash": dflash,
        "autoregressive": ar,
        "acceptance_length": dflash["acceptance_length"],
        "per_position_acceptance": dflash["per_position_acceptance"],
        "speedup": round(dflash["tokens_per_second"] / ar["tokens_per_second"], 4) if ar["tokens_per_second"] else None,
        "lossless": lossless,
        "mismatched_prompts": mismatches,
        "step": {
            "draft_ms": round(1e3 * draft, 3),
            "verify_ms": round(1e3 * verify, 3),
            "autoregressive_forward_ms": round(1e3 * ar_forward, 3),
            "step_cost_ratio": round((draft + verify) / verify, 4) if verify else None,
        },
    }
    if getattr(be, "files", None):   # a graph backend: the graph file each model call ran
        report["graphs"] = dict(be.files)
    return report
