"""τ from a server's ``/metrics``, read before and after each load level.

- dflash-trt's embedded server: ``dflash_spec_committed_tokens_total / dflash_spec_rounds_total``;
- vLLM: ``1 + vllm:spec_decode_num_accepted_tokens_total / vllm:spec_decode_num_drafts_total``;
- SGLang: the ``sglang:spec_accept_length`` gauge (read after the level);
- TensorRT-LLM (``trtllm-serve``, PyTorch backend with ``enable_iter_perf_stats``): a JSON
  list of iteration rows whose ``specDecodingStats`` carry ``numAcceptedTokens`` and
  ``numRequestsWithDraftTokens``; τ = (accepted + requests) / requests. trtllm-serve hands
  each row out once, so the scrape after a level covers exactly that level.
"""

from __future__ import annotations

import json


def parse_spec_metrics(body: str) -> dict | None:
    """Speculative-decoding counters from a /metrics body, or None when it reports none.

    Returns ``{"kind": ..., "num": float, "den": float}`` (τ = Δnum / Δden between two
    scrapes) or ``{"kind": "gauge", "tau": float}`` for servers that only report a gauge.
    """
    text = body.strip()
    if text.startswith("[") or text.startswith("{"):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError:
            return None
        rows = rows if isinstance(rows, list) else [rows]
        acc = req = 0
        found = False
        for row in rows:
            spec = row.get("specDecodingStats") if isinstance(row, dict) else None
            if not isinstance(spec, dict) or row.get("attentionDpRank", 0) != 0:
                continue
            found = True
            acc += int(spec.get("numAcceptedTokens", 0))
            req += int(spec.get("numRequestsWithDraftTokens", 0))
        return {"kind": "trtllm", "num": acc + req, "den": req, "windowed": True} if found else None
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.rsplit(None, 1)
        if len(parts) != 2:
            continue
        key = parts[0].split("{", 1)[0]
        try:
            values[key] = values.get(key, 0.0) + float(parts[1])
        except ValueError:
            continue
    if "dflash_spec_rounds_total" in values:
        return {
            "kind": "dflash",
            "num": values.get("dflash_spec_committed_tokens_total", 0.0),
            "den": values["dflash_spec_rounds_total"],
        }
    if "vllm:spec_decode_num_drafts_total" in values:
        d = values["vllm:spec_decode_num_drafts_total"]
        return {"kind": "vllm", "num": d + values.get("vllm:spec_decode_num_accepted_tokens_total", 0.0), "den": d}
    if "sglang:spec_accept_length" in values:
        return {"kind": "gauge", "tau": values["sglang:spec_accept_length"]}
    return None


def tau_between(before: dict | None, after: dict | None) -> float | None:
    """τ over the window between two scrapes (see :func:`parse_spec_metrics`)."""
    if after is None:
        return None
    if after["kind"] == "gauge":
        return after["tau"] or None
    if after.get("windowed"):  # trtllm-serve: the rows since the previous scrape
        num, den = after["num"], after["den"]
    elif before is not None and before["kind"] == after["kind"]:
        num, den = after["num"] - before["num"], after["den"] - before["den"]
    else:
        return None
    return round(num / den, 4) if den > 0 else None
