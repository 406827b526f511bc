"""What keeping Gated DeltaNet states exact costs per round, on a random Qwen3.5-shaped target.

    python bench/hybrid_rollback.py [--hidden 1024 --layers 8 --batch 4 --block 16 --rounds 4]

Builds a random ``Qwen3_5ForCausalLM`` (3 linear-attention layers to 1 full, the Qwen3.5 ratio;
linear heads 16 key x 32 value of 128, as Qwen3.5), prefills a batch, then times rounds of
a verify forward over ``--block`` tokens followed by the commit that settles the states
(``runtime/recurrent.py``: the verify keeps each linear layer's state after every position,
as chunk factors; the commit selects each row's accepted prefix), with acceptance lengths
drawn uniformly from 1..block. Prints one JSON line: per-round milliseconds of a plain
verify forward (transformers' kernels, no bookkeeping), of the runtime's verify, of its
commit, their ratio ``(verify + commit) / plain``, and per row the state bytes and what a
verify keeps until its commit.
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch


def _model(hidden: int, layers: int):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(
        vocab_size=4096,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 256),
        num_key_value_heads=1,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        max_position_embeddings=4096,
    )
    return Qwen3_5ForCausalLM(cfg).float().eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()

    from dflash_trt.model import Target
    from dflash_trt.runtime import TorchBackend

    torch.set_num_threads(a.threads)  # a busy small machine: more threads than cores skews every figure
    torch.manual_seed(0)
    backend = TorchBackend(Target(_model(a.hidden, a.layers)), None)
    policy, b, B = backend.caches, a.batch, a.block
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        cache, _ = backend.new_caches(b, draft=False)
        ids = torch.randint(0, 4096, (b, a.prompt), generator=g)
        col_valid = torch.ones(b, a.prompt, dtype=torch.bool)
        backend.target_forward(ids, torch.arange(a.prompt).expand(b, -1), col_valid, cache, False)
        pos = a.prompt
        t_fwd = t_snap = t_replay = 0.0
        pending = 0
        for _ in range(a.rounds):
            block = torch.randint(0, 4096, (b, B), generator=g)
            attn = torch.cat([col_valid, torch.ones(b, B, dtype=torch.bool)], dim=1)
            positions = pos + torch.arange(B).expand(b, -1)
            scratch = copy.deepcopy(cache)  # the plain forward must leave the real cache alone
            t0 = time.perf_counter()
            backend.target.forward(block, positions, attn.long(), scratch, capture=False)
            t1 = time.perf_counter()
            backend.target_forward(block, positions, attn, cache, False)  # keeping per-token states
            t2 = time.perf_counter()
            pending = policy.recurrent.pending_bytes_per_row(cache)
            n_new = torch.randint(1, B + 1, (b,), generator=g)
            col_valid = torch.cat([col_valid, torch.arange(B)[None] < n_new[:, None]], dim=1)
            backend.commit_cache(cache, col_valid, n_new)
            t3 = time.perf_counter()
            col_valid = backend.compact(cache, col_valid)
            pos += B  # positions only need to grow; the timing does not depend on them
            t_fwd, t_snap, t_replay = t_fwd + (t1 - t0), t_snap + (t2 - t1), t_replay + (t3 - t2)
    lin = policy.recurrent.mixers
    state = (
        sum(cache.layers[i].conv_states[0][0].numel() + cache.layers[i].recurrent_states[0][0].numel() for i in lin) * 4
    )
    r = a.rounds
    print(
        json.dumps(
            {
                "hidden": a.hidden,
                "layers": a.layers,
                "linear_layers": len(lin),
                "batch": b,
                "block": B,
                "verify_ms": round(1e3 * t_fwd / r, 2),
                "runtime_verify_ms": round(1e3 * t_snap / r, 2),
                "commit_ms": round(1e3 * t_replay / r, 2),
                "verify_plus_commit_over_verify": round((t_snap + t_replay) / t_fwd, 3),
                "state_bytes_per_row": state,
                "verify_pending_bytes_per_row": pending,
            }
        )
    )


if __name__ == "__main__":
    main()
