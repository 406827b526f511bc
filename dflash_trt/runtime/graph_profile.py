"""What one request needs of the engines' profile (``ingest.EngineProfile``), before any work.

Pure arithmetic over prompt lengths, ``max_new_tokens``, the block size and the page size: no
tensor, no graph. :func:`request_shapes` is the largest extent of each profile dimension one
``generate`` call reaches; :func:`request_problem` names the first that does not fit (None: the
request fits). :meth:`~dflash_trt.runtime.graph_backend.GraphBackend.check_request` refuses on it.
"""

from __future__ import annotations


def request_shapes(prompt_lengths: list[int], max_new_tokens: int, block_size: int, page_size: int) -> dict[str, int]:
    """The largest extent of each profile dimension (``build.export.DYNAMIC_AXES``'s names) one
    ``generate`` call reaches, for prompts of these lengths.

    Per row of prompt length l: the prefill forward is l tokens; a round runs while the row has
    generated g < max_new tokens, with the target cache (after compaction by row) and the
    drafter's context holding the l + g - 1 <= l + max_new - 2 committed tokens but the last;
    the verify forward adds the B block columns; the drafter's pages are never freed in a call.
    """
    ctx = [n + max(max_new_tokens - 2, 0) for n in prompt_lengths] if max_new_tokens > 1 else [0] * len(prompt_lengths)
    pages = [-(-c // page_size) for c in ctx] if block_size > 1 else [0]
    longest = max(prompt_lengths)
    return {
        "batch": len(prompt_lengths),
        "tokens": max(longest, block_size if max_new_tokens > 1 else 1),
        "seq": max(longest, max(ctx) + block_size if max_new_tokens > 1 else 0),
        "pages_per_seq": max(pages),
        "pages": sum(pages),
    }


def request_problem(profile, prompt_lengths: list[int], max_new_tokens: int, block_size: int) -> str | None:
    """What of a request does not fit ``profile`` (None: all of it does; see :func:`request_shapes`)."""
    p = profile
    need = request_shapes(prompt_lengths, max_new_tokens, block_size, p.page_size)
    longest = max(prompt_lengths)
    checks = [
        (need["batch"] > p.max_batch, f"batch {need['batch']} > {p.max_batch}"),
        (need["tokens"] > p.max_tokens, f"a {need['tokens']}-token forward > {p.max_tokens}"),
        (
            need["seq"] > p.max_seq_len,
            f"a {longest}-token prompt + {max_new_tokens} new tokens need {need['seq']} "
            f"target-cache columns > {p.max_seq_len}",
        ),
        (
            need["pages_per_seq"] > p.max_pages_per_seq,
            f"{need['pages_per_seq']} drafter pages per sequence > {p.max_pages_per_seq}",
        ),
        (need["pages"] > p.max_pages, f"{need['pages']} drafter pages > the pool's {p.max_pages}"),
    ]
    return next((why for bad, why in checks if bad), None)
