"""CPU timing of the reference block attention (``plugins.block_attention_reference``) against
the form it replaced, which copied the keys and values once per query head (``repeat_interleave``)
before SDPA instead of letting SDPA read the shared kv head (``enable_gqa``).

    python bench/reference_attention.py [--threads 1] [--iters 30]

Shapes: (batch, block, heads, kv heads, head dim, context): the embedded drafter's at 300 and
2000 context tokens, and a Qwen3-8B drafter layer's at 8k. Prints the median milliseconds of each
form, interleaved run by run, after checking they agree.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dflash_trt.plugins import attention as ba  # noqa: E402

SHAPES = [(1, 8, 4, 2, 32, 300), (1, 8, 4, 2, 32, 2000), (4, 8, 32, 8, 128, 8192)]


def copied_heads(q, k, v, k_cache, v_cache, page_table, lengths, *, causal, window, scale):
    """The previous reference: kv heads repeated to the query heads, then SDPA."""
    b, B, h, d = q.shape
    rep = h // k.shape[2]
    n = int(lengths.max())
    keys = torch.cat([ba.gather_pages(k_cache, page_table, n), k], 1).repeat_interleave(rep, 2).transpose(1, 2)
    vals = torch.cat([ba.gather_pages(v_cache, page_table, n), v], 1).repeat_interleave(rep, 2).transpose(1, 2)
    mask = ba.visibility(lengths, n, B, causal, window)
    return F.scaled_dot_product_attention(
        q.transpose(1, 2), keys, vals, attn_mask=mask[:, None], scale=scale
    ).transpose(1, 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--iters", type=int, default=30)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    for b, B, h, kvh, d, n in SHAPES:
        ps = 16
        per = (n + ps - 1) // ps
        q, k, v = torch.randn(b, B, h, d), torch.randn(b, B, kvh, d), torch.randn(b, B, kvh, d)
        kc, vc = torch.randn(b * per + 1, ps, kvh, d), torch.randn(b * per + 1, ps, kvh, d)
        args = (q, k, v, kc, vc, torch.arange(b * per).view(b, per).int(), torch.full((b,), n))
        kw = dict(causal=False, window=None, scale=d**-0.5)
        torch.testing.assert_close(ba.block_attention_reference(*args, **kw), copied_heads(*args, **kw))
        times = {"enable_gqa": [], "copied_heads": []}
        for _ in range(a.iters):
            for name, f in (("enable_gqa", ba.block_attention_reference), ("copied_heads", copied_heads)):
                t = time.perf_counter()
                f(*args, **kw)
                times[name].append(time.perf_counter() - t)
        med = {name: sorted(ts)[len(ts) // 2] * 1e3 for name, ts in times.items()}
        print(
            f"b {b} block {B} heads {h}/{kvh} d {d} context {n}: "
            + ", ".join(f"{name} {ms:.3f} ms" for name, ms in med.items())
            + f" ({med['copied_heads'] / med['enable_gqa']:.2f}x)"
        )


if __name__ == "__main__":
    main()
