"""Lossless, measured on a running deployment: greedy completions agree with a baseline.

Each prompt of the set (code, math, prose, chat; chat prompts rendered with the target's own chat
template) is sent as token ids to ``/v1/completions`` at temperature 0, to the deployment and to
the baseline: a second server running the same target without speculation (``--baseline``), or
the reference runtime decoding the bundle's target greedily (small targets). Speculative decoding
is lossless, so the two must agree token for token.

Where they do not, the first differing position ``k`` is reported with the target's top-2
logprob margin there, ``m = log p(top1) - log p(top2)`` given the prompt and the ``k`` tokens both
agree on. A margin under :data:`NEAR_TIE` nats is a near-tie that numerics (BF16 kernels, a
different batch composition) may flip: reported, not failed. A clear margin is a bug. The margin is
read from the baseline's logprobs, else the deployment's (both are the target's distribution at
``k``: the prefix is common), else computed by the reference runtime; a divergence whose margin
nobody can give fails too ("margin not measured").
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

from dflash_trt.errors import DFlashError

NEAR_TIE = 0.5  # nats: BF16 logits of magnitude ~20 carry errors of ~0.1
TOP_LOGPROBS = 2


@dataclass
class Answer:
    """One completion as compared: ids when known, else the server's token strings."""

    ids: list[int] | None
    tokens: list[str] | None
    text: str
    top2: list[float | None] | None = None  # margin per position, where logprobs came


@dataclass
class Prompt:
    kind: str
    text: str  # what is shown in the report
    ids: list[int]


def read_prompts(path: str | Path, tokenizer, enable_thinking: bool | None = None) -> list[Prompt]:
    """``{"kind", "prompt"}`` or ``{"kind", "messages"}`` per line; chat rendered by the template."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DFlashError(f"--prompts {path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            kind = str(row.get("kind", "prompt"))
            if "messages" in row:
                kw = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
                text = tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=False, **kw)
                ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                shown = row["messages"][-1]["content"]
            else:
                shown = row["prompt"]
                ids = tokenizer(shown, add_special_tokens=True)["input_ids"]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DFlashError(f"--prompts {path}:{n}: expected JSON with 'prompt' or 'messages' ({exc})") from None
        out.append(Prompt(kind, str(shown)[:60], list(ids)))
    if not out:
        raise DFlashError(f"--prompts {path}: no prompts")
    return out


def margins(logprobs: dict | None) -> list[float | None] | None:
    """top1 - top2 logprob per position of an OpenAI ``logprobs`` object (None where < 2 came)."""
    tops = (logprobs or {}).get("top_logprobs")
    if not isinstance(tops, list):
        return None
    out: list[float | None] = []
    for d in tops:
        v = sorted((float(x) for x in (d or {}).values()), reverse=True)
        out.append(round(v[0] - v[1], 4) if len(v) >= 2 else None)
    return out


class ServerSide:
    """Greedy completions from one server; asks for top-2 logprobs until the server refuses them."""

    def __init__(self, url: str, model: str | None):
        from dflash_trt.serve import CompletionClient  # start-up: torch (the serve package loads it)

        self.client = CompletionClient(url, model, retries=2)
        self.logprobs = True

    async def answer(self, prompt: Prompt, max_tokens: int) -> Answer:
        if self.logprobs:
            try:
                c = await self.client.complete(prompt.ids, max_tokens, 0.0, logprobs=TOP_LOGPROBS)
            except DFlashError as exc:  # e.g. the embedded server: 400 "logprobs are not supported"
                if "logprobs" not in str(exc):
                    raise
                self.logprobs = False
        if not self.logprobs:
            c = await self.client.complete(prompt.ids, max_tokens, 0.0)
        tokens = (c.logprobs or {}).get("tokens")
        return Answer(c.token_ids, list(tokens) if isinstance(tokens, list) else None, c.text, margins(c.logprobs))


class ReferenceSide:
    """The bundle's target on the reference runtime: greedy ids, and the margin at any prefix."""

    def __init__(self, pair):
        self.pair = pair
        self.lock: asyncio.Lock | None = None

    async def answer(self, prompt: Prompt, max_tokens: int) -> Answer:
        from dflash_trt.runtime import generate  # start-up: torch (offline verify needs none)

        self.lock = self.lock or asyncio.Lock()
        async with self.lock:  # one model, one generation at a time
            gen = await asyncio.to_thread(
                generate,
                self.pair.target,
                None,
                [prompt.ids],
                max_new_tokens=max_tokens,
                block_size=1,
                stop_token_ids=self.pair.stop_token_ids,
            )
        ids = list(gen.token_ids[0])
        return Answer(ids, None, self.pair.decode(ids))

    def margin(self, ids: list[int]) -> float:
        import torch  # start-up: torch (offline verify needs none)

        with torch.inference_mode():
            logits = self.pair.target.model(torch.tensor([ids])).logits[0, -1].float()  # [V]
        top = torch.log_softmax(logits, -1).topk(2).values
        return round(float(top[0] - top[1]), 4)


def _sequences(a: Answer, b: Answer, tokenizer, stops: frozenset[int]) -> tuple[list, list, bool]:
    """The two completions in one currency: ids (a trailing stop token dropped: servers differ on
    returning it), else token strings, else (ids one side, strings the other) equal texts agree and
    differing ones are re-tokenized, their positions approximate (the flag: whether positions
    index ids both sides agree on)."""
    if a.ids is not None and b.ids is not None:
        strip = lambda ids: ids[:-1] if ids and ids[-1] in stops else ids  # noqa: E731
        return strip(a.ids), strip(b.ids), True
    if a.tokens is not None and b.tokens is not None:
        return a.tokens, b.tokens, False
    if a.text == b.text:  # ids on one side, token strings on the other: the same text agrees
        return [a.text], [b.text], False
    enc = lambda x: x.ids if x.ids is not None else tokenizer(x.text, add_special_tokens=False)["input_ids"]  # noqa: E731
    return enc(a), enc(b), True


def first_divergence(a: list, b: list) -> int | None:
    """The first position where ``a`` and ``b`` differ (one ending first counts), None if equal."""
    for k, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(prompt: Prompt, served: Answer, base: Answer, tokenizer, reference: ReferenceSide | None) -> dict:
    """One prompt's row of the lossless check."""
    stops = frozenset(reference.pair.stop_token_ids if reference is not None else [])
    stops |= {tokenizer.eos_token_id} if getattr(tokenizer, "eos_token_id", None) is not None else set()
    a, b, are_ids = _sequences(served, base, tokenizer, stops)
    row = {"kind": prompt.kind, "prompt": prompt.text, "tokens": len(served.ids or served.tokens or a), "agree": True}
    k = first_divergence(a, b)
    if k is None:
        return row
    margin, source = None, None
    for name, side in (("baseline logprobs", base), ("endpoint logprobs", served)):
        if side.top2 and k < len(side.top2) and side.top2[k] is not None:
            margin, source = side.top2[k], name
            break
    if margin is None and reference is not None and are_ids:
        margin, source = reference.margin(prompt.ids + list(a[:k])), "reference runtime"
    verdict = "not measured" if margin is None else ("numerics" if margin < NEAR_TIE else "bug")
    row.update(
        agree=False,
        position=k,
        endpoint_token=_at(a, k),
        baseline_token=_at(b, k),
        margin=margin,
        margin_source=source,
        verdict=verdict,
    )
    return row


def _at(seq: list, k: int):
    return seq[k] if k < len(seq) else "(end)"


async def _run(prompts: list[Prompt], served: ServerSide, base, max_tokens: int, concurrency: int) -> list[tuple]:
    sem = asyncio.Semaphore(concurrency)

    async def one(p: Prompt) -> tuple:
        async with sem:
            return await served.answer(p, max_tokens), await base.answer(p, max_tokens)

    try:
        return await asyncio.gather(*(one(p) for p in prompts))
    finally:
        await served.client.close()
        if isinstance(base, ServerSide):
            await base.client.close()


def check(
    prompts: list[Prompt],
    url: str,
    model: str | None,
    *,
    baseline: str | None,
    baseline_model: str | None,
    reference: ReferenceSide | None,
    tokenizer,
    max_tokens: int,
    concurrency: int = 4,
) -> dict:
    """The lossless check's result: status, one-line summary, and a row per prompt."""
    if baseline is None and reference is None:
        return {
            "name": "lossless",
            "status": "not measured",
            "summary": "no baseline: pass --baseline URL (the same target served without speculation)",
        }
    served = ServerSide(url, model)
    base = ServerSide(baseline, baseline_model) if baseline else reference
    pairs = asyncio.run(_run(prompts, served, base, max_tokens, concurrency))
    rows = [compare(p, s, b, tokenizer, reference) for p, (s, b) in zip(prompts, pairs, strict=True)]
    bad = [r for r in rows if r.get("verdict") in ("bug", "not measured")]
    ties = [r for r in rows if r.get("verdict") == "numerics"]
    against = f"baseline {baseline}" if baseline else "the reference runtime"
    if bad:
        r = bad[0]
        m = (
            "margin not measured"
            if r["margin"] is None
            else f"top-2 margin {r['margin']:.2f} nats ({r['margin_source']})"
        )
        summary = (
            f"{len(bad)} of {len(rows)} completions diverge from {against}; first: {r['kind']} prompt "
            f"{r['prompt']!r} at token {r['position']}, {m}: a bug, not numerics"
        )
    else:
        summary = f"{len(rows) - len(ties)} of {len(rows)} greedy completions identical to {against}" + (
            f"; {len(ties)} diverge at near-ties (margin < {NEAR_TIE} nats: numerics)" if ties else ""
        )
    return {
        "name": "lossless",
        "status": "fail" if bad else "pass",
        "summary": summary,
        "details": {"against": against, "max_tokens": max_tokens, "near_tie_nats": NEAR_TIE, "prompts": rows},
    }
