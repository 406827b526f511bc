"""GPU benchmark of the DFlash Triton kernels vs the torch reference.

Qwen3-8B drafter shapes by default: 5 layers, 32 query / 8 kv heads, head_dim 128, block
16, contexts 1k..32k, batch 1..64, bf16. For each (batch, context) it times

* block attention (one layer): Triton kernel vs ``block_attention_reference``,
* KV injection (all layers, 16 new tokens per sequence, hidden 4096, 5 target_hidden): Triton path
  vs ``kv_injection_reference``; and the scatter kernel alone,

and reports achieved bandwidth (bytes the kernel must move / time) against the device
copy bandwidth measured here (``dst.copy_(src)`` of a large tensor, read + write).

    python bench/kernels.py                    # the full table
    python bench/kernels.py --batch 1 8 --context 1024 8192 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--context", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--target_hidden", type=int, default=5)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--window", type=int, default=None, help="sliding window (default: none)")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--no-reference", action="store_true", help="skip the (slow, memory-hungry) reference")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--max-cache-gib", type=float, default=40.0, help="skip configs whose cache exceeds this")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON ('-' for stdout)")
    return p.parse_args(argv)


def timeit(fn, iters: int) -> float:
    """Median milliseconds over ``iters`` CUDA-event-timed calls, after warm-up."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def copy_bandwidth(iters: int) -> float:
    import torch

    n = 1 << 30  # 1 GiB
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = timeit(lambda: dst.copy_(src), iters)
    return 2 * n / (ms * 1e-3) / 1e9  # GB/s, read + write


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench/kernels.py needs a CUDA GPU (and triton); none is available here", file=sys.stderr)
        return 2
    from dflash_trt.plugins import attention as ba
    from dflash_trt.plugins import injection as kvi
    from dflash_trt.plugins import triton_kernels as tk

    dtype = getattr(torch, args.dtype)
    esz = torch.finfo(dtype).bits // 8
    L, h, kvh, d, B, ps = args.layers, args.heads, args.kv_heads, args.head_dim, args.block, args.page_size
    dev = "cuda"
    peak = copy_bandwidth(args.iters)
    rows = []
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, d, 2, device=dev).float() / d))
    for b in args.batch:
        for ctx in args.context:
            pages_per = (ctx + B + ps - 1) // ps
            pool = b * pages_per
            cache_bytes = 2 * L * pool * ps * kvh * d * esz
            if cache_bytes > args.max_cache_gib * 2**30:
                continue
            g = torch.Generator(device=dev).manual_seed(0)
            kc = torch.randn(L, pool, ps, kvh, d, device=dev, dtype=dtype, generator=g)
            vc = torch.randn_like(kc)
            pt = torch.randperm(pool, device=dev, generator=g).int().view(b, pages_per)
            lengths = torch.full((b,), ctx, device=dev, dtype=torch.long)
            q = torch.randn(b, B, h, d, device=dev, dtype=dtype, generator=g)
            k = torch.randn(b, B, kvh, d, device=dev, dtype=dtype, generator=g)
            v = torch.randn_like(k)
            kw = dict(causal=args.causal, window=args.window, scale=d**-0.5)
            row = {"batch": b, "context": ctx}
            # attention reads the visible context K/V once + q/k/v + writes the output
            vis = min(ctx, args.window) if args.window else ctx
            attn_bytes = b * (2 * vis * kvh * d + 2 * B * h * d + 2 * B * kvh * d) * esz
            row["attn_triton_ms"] = timeit(
                partial(tk.block_attention, q, k, v, kc[0], vc[0], pt, lengths, **kw), args.iters
            )
            row["attn_triton_GBps"] = attn_bytes / (row["attn_triton_ms"] * 1e-3) / 1e9
            if not args.no_reference:
                try:
                    row["attn_ref_ms"] = timeit(
                        partial(ba.block_attention_reference, q, k, v, kc[0], vc[0], pt, lengths, **kw),
                        max(3, args.iters // 4),
                    )
                except torch.OutOfMemoryError:
                    row["attn_ref_ms"] = None
            # KV injection: B new tokens per sequence into every layer
            T = B
            lengths_inj = torch.full((b,), ctx - T, device=dev, dtype=torch.long)
            n_new = torch.full((b,), T, device=dev, dtype=torch.long)
            target_hidden = torch.randn(b, T, args.target_hidden * args.hidden, device=dev, dtype=dtype, generator=g)
            fc = torch.randn(args.hidden, args.target_hidden * args.hidden, device=dev, dtype=dtype, generator=g) * 0.01
            wkv = torch.randn(L * 2 * kvh * d, args.hidden, device=dev, dtype=dtype, generator=g) * 0.01
            kn = torch.ones(L, d, device=dev, dtype=dtype)
            inj = dict(
                target_hidden=target_hidden,
                n_new=n_new,
                lengths=lengths_inj,
                fc_weight=fc,
                norm_weight=torch.ones(args.hidden, device=dev, dtype=dtype),
                kv_weight=wkv,
                kv_bias=None,
                k_norm_weight=kn,
                inv_freq=inv_freq,
                rope_scale=1.0,
                eps=1e-6,
                k_cache=kc,
                v_cache=vc,
                page_table=pt,
                num_kv_heads=kvh,
                head_dim=d,
            )
            kv = torch.randn(b, T, L * 2 * kvh * d, device=dev, dtype=dtype, generator=g)
            scatter_bytes = 2 * kv.numel() * esz  # read kv, write K and V
            row["scatter_triton_ms"] = timeit(
                partial(
                    tk.kv_scatter,
                    kv,
                    kn,
                    inv_freq,
                    n_new,
                    lengths_inj,
                    pt,
                    kc,
                    vc,
                    eps=1e-6,
                    rope_scale=1.0,
                    num_kv_heads=kvh,
                    head_dim=d,
                ),
                args.iters,
            )
            row["scatter_GBps"] = scatter_bytes / (row["scatter_triton_ms"] * 1e-3) / 1e9
            row["inject_triton_ms"] = timeit(partial(kvi.kv_injection_triton, **inj), args.iters)
            if not args.no_reference:
                row["inject_ref_ms"] = timeit(partial(kvi.kv_injection_reference, **inj), max(3, args.iters // 4))
            rows.append(row)
            del kc, vc
            torch.cuda.empty_cache()

    print(f"device: {torch.cuda.get_device_name()}  copy bandwidth: {peak:.0f} GB/s  dtype: {args.dtype}")
    cols = [
        "batch",
        "context",
        "attn_triton_ms",
        "attn_ref_ms",
        "attn_triton_GBps",
        "scatter_triton_ms",
        "scatter_GBps",
        "inject_triton_ms",
        "inject_ref_ms",
    ]
    print(" ".join(f"{c:>17}" for c in cols) + f" {'attn %peak':>11}")
    for r in rows:
        cells = []
        for c in cols:
            val = r.get(c)
            cells.append(f"{val:>17.3f}" if isinstance(val, float) else f"{str(val):>17}")
        print(" ".join(cells) + f" {100 * r['attn_triton_GBps'] / peak:>10.1f}%")
    if args.json:
        doc = json.dumps({"copy_GBps": peak, "dtype": args.dtype, "args": vars(args), "rows": rows}, indent=2)
        if args.json == "-":
            print(doc)
        else:
            Path(args.json).write_text(doc + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
