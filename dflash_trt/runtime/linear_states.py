"""Linear-attention verify kernels that keep the state after every position, as factors.

Gated DeltaNet (qwen3_5, qwen3_next), KDA (kimi_linear, glm5_next) and Mamba2 (nemotron_h)
are one recurrence over a state ``S`` [d_k, d_v] per head, for tokens t = 1..T:

    S_t = diag(a_t) S_{t-1} + k_t u_t^T          a_t = exp(g_t): per head (GDN, Mamba2) or per key channel (KDA)
    u_t = beta_t (v_t - k_t^T diag(a_t) S_{t-1})  the delta rule (GDN, KDA); Mamba2: u_t = v_t = dt_t x_t
    o_t = q_t^T S_t                              Mamba2: q = C, k = B, plus its D x_t skip

Over a verify block it unrolls, with G_t = g_1 + ... + g_t, into

    S_n = diag(exp G_n) S_0 + sum_{j <= n} diag(exp(G_n - G_j)) k_j u_j^T          (1)

and the u_j solve one unit lower-triangular system (the chunked WY form, Yang et al., "Gated
Delta Networks", ICLR 2025). So the block's ``(S_0, k, G, u)`` are the state after *every*
position: the commit materialises ``S_n`` for the accepted prefix n of each row with (1), one
[d_k, n] x [n, d_v] product per head; no token runs through a layer twice. They cost
``T x (d_k + d_v + gates)`` elements per head instead of ``T x d_k x d_v`` for stored states
(SGLang's ``extra_buffer`` keeps the latter; TensorRT-LLM PR #13782 updates the GDN state
after acceptance). The block is one chunk of exactly T tokens: no padding to 64.

The adapters below take the arguments of transformers' torch kernels
(``torch_chunk_gated_delta_rule``, ``chunk_kimi_delta_attention``, ``mamba2_chunk_scan``),
return what they return, and hand the factors to ``record``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Factors:
    """One layer's verify block: S0 [b, h, dk, dv], k [b, h, T, dk], G [b, h, T, c] (cumulative
    log-decay, c = 1 or dk), u [b, h, T, dv]; ``transposed``: the cache holds S^T (Mamba2)."""

    S0: torch.Tensor
    k: torch.Tensor
    G: torch.Tensor
    u: torch.Tensor
    transposed: bool = False

    def state(self, n: torch.Tensor, consume: bool = False) -> torch.Tensor:
        """(1) for each row's n [b] in 0..T: the state after its first n tokens, in the cache's
        layout. ``consume``: computed in place over S0 (a commit's last use of the block)."""
        b, h, T, c = self.G.shape
        last = (n - 1).clamp(min=0).view(b, 1, 1, 1).expand(b, h, 1, c)
        Gn = torch.where(n.view(b, 1, 1, 1) > 0, self.G.gather(2, last), 0.0)  # [b, h, 1, c]
        kept = (torch.arange(T, device=n.device)[None] < n[:, None]).view(b, 1, T, 1)
        w = torch.where(kept, Gn - self.G, float("-inf")).exp()  # [b, h, T, c]
        decay = Gn.transpose(-1, -2).exp()
        S = self.S0.mul_(decay) if consume else (decay * self.S0).contiguous()
        dk, dv = S.shape[-2:]
        S.view(-1, dk, dv).baddbmm_(_t(self.k * w).view(-1, dk, T), self.u.reshape(-1, T, dv))
        return S.transpose(-1, -2) if self.transposed else S

    def nbytes_per_row(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in (self.S0, self.k, self.G, self.u))


def chunk(q, k, v, g, beta, S0) -> tuple[torch.Tensor, Factors]:
    """q, k [b, h, T, dk]; v [b, h, T, dv]; g [b, h, T, c] log-decay per step; beta [b, h, T] or
    None (no delta correction); S0 [b, h, dk, dv]. Returns o [b, h, T, dv] and the factors."""
    T = q.shape[2]
    G = g.cumsum(2)  # [b, h, T, c]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    decay = torch.where(causal[:, :, None], G[:, :, :, None] - G[:, :, None], float("-inf")).exp()  # [b,h,T,T,c]
    if G.shape[-1] == 1:
        qk, kk = (q @ k.transpose(-1, -2)) * decay[..., 0], (k @ k.transpose(-1, -2)) * decay[..., 0]
    else:
        qk = torch.einsum("bhtd,bhtjd,bhjd->bhtj", q, decay, k)  # [b, h, T, T]
        kk = torch.einsum("bhtd,bhtjd,bhjd->bhtj", k, decay, k)
    eG = G.exp()
    if beta is None:
        u = v
    else:
        A = kk.tril(-1) * beta[..., None] + torch.eye(T, dtype=q.dtype, device=q.device)
        u = torch.linalg.solve_triangular(
            A, beta[..., None] * (v - (k * eG) @ S0), upper=False, unitriangular=True
        )  # [b, h, T, dv]
    o = (q * eG) @ S0 + qk @ u
    return o, Factors(S0, k, G, u)


def final(f: Factors) -> torch.Tensor:
    """S_T [b, h, dk, dv] of a block (in the kernel's layout)."""
    w = (f.G[:, :, -1:] - f.G).exp()
    return f.G[:, :, -1:].transpose(-1, -2).exp() * f.S0 + _t(f.k * w) @ f.u


def _t(x: torch.Tensor) -> torch.Tensor:
    """x [..., T, d] -> [..., d, T], contiguous: a batched matmul over a transposed view runs
    ~20x slower on CPU."""
    return x.transpose(-1, -2).contiguous()


def _start(initial, shape, like) -> torch.Tensor:
    return like.new_zeros(shape) if initial is None else initial.to(like).clone(memory_format=torch.contiguous_format)


def gated_delta(record, l2norm):
    """``torch_chunk_gated_delta_rule`` (transformers' qwen3_5 / qwen3_next) that records factors."""

    def kernel(
        query,
        key,
        value,
        g,
        beta,
        chunk_size=64,
        initial_state=None,
        output_final_state=False,
        use_qk_l2norm_in_kernel=False,
        **kwargs,
    ):
        dtype = query.dtype
        hv, hk = value.shape[2], key.shape[2]
        if hv != hk:  # each q/k head serves hv // hk consecutive value heads
            query, key = (x.repeat_interleave(hv // hk, dim=2) for x in (query, key))
        q, k, v, beta, g = (x.transpose(1, 2).to(torch.float32) for x in (query, key, value, beta, g))
        if use_qk_l2norm_in_kernel:
            q, k = l2norm(q, dim=-1, eps=1e-6), l2norm(k, dim=-1, eps=1e-6)
        q = q * q.shape[-1] ** -0.5
        S0 = _start(initial_state, (*k.shape[:2], k.shape[-1], v.shape[-1]), v)
        o, f = chunk(q, k, v, g[..., None], beta, S0)
        record(f)
        return o.transpose(1, 2).contiguous().to(dtype), final(f) if output_final_state else None

    return kernel


def kimi_delta(record, l2norm):
    """``chunk_kimi_delta_attention`` (kimi_linear, glm5_next: per-channel decay) that records factors."""

    def kernel(
        query,
        key,
        value,
        g,
        beta,
        chunk_size=64,
        initial_state=None,
        output_final_state=False,
        use_qk_l2norm_in_kernel=False,
        **kwargs,
    ):
        dtype = query.dtype
        q, k, v, beta, g = (x.transpose(1, 2).to(torch.float32) for x in (query, key, value, beta, g))
        if use_qk_l2norm_in_kernel:
            q, k = l2norm(q, dim=-1, eps=1e-6), l2norm(k, dim=-1, eps=1e-6)
        q = q * q.shape[-1] ** -0.5
        S0 = _start(initial_state, (*k.shape[:2], k.shape[-1], v.shape[-1]), v)
        o, f = chunk(q, k, v, g, beta, S0)
        record(f)
        return o.transpose(1, 2).contiguous().to(dtype), final(f) if output_final_state else None

    return kernel


def mamba2(record, l2norm=None):
    """``mamba2_chunk_scan`` (nemotron_h) that records factors: S = h^T (h [p, n] per head)."""

    def kernel(
        hidden_states,
        dt,
        A,
        B,
        C,
        chunk_size,
        D=None,
        dt_bias=None,
        initial_states=None,
        dt_softplus=False,
        dt_limit=(0.0, float("inf")),
        return_final_states=False,
        **kwargs,
    ):
        b, T, h, p = hidden_states.shape
        if dt_bias is not None:
            dt = dt + dt_bias.to(dt.dtype)
        if dt_softplus:
            dt = F.softplus(dt)
        dt = torch.clamp(dt, min=dt_limit[0], max=dt_limit[1]).float()  # [b, T, h]
        x = hidden_states.float()
        rep = h // B.shape[2]
        Bh, Ch = (t.float().repeat_interleave(rep, dim=2).transpose(1, 2) for t in (B, C))  # [b, h, T, n]
        g = (A.float() * dt).transpose(1, 2)[..., None]  # [b, h, T, 1]
        v = (x * dt[..., None]).transpose(1, 2)  # [b, h, T, p]
        S0 = _start(None if initial_states is None else initial_states.transpose(-1, -2), (b, h, Bh.shape[-1], p), v)
        o, f = chunk(Ch, Bh, v, g, None, S0)
        f.transposed = True
        record(f)
        y = o.transpose(1, 2)
        if D is not None:
            y = y + D[:, None] * x
        return (y, final(f).transpose(-1, -2)) if return_final_states else y

    return kernel


# module-level kernel name in transformers' modeling file -> adapter
KERNELS = {
    "torch_chunk_gated_delta_rule": gated_delta,
    "chunk_kimi_delta_attention": kimi_delta,
    "mamba2_chunk_scan": mamba2,
}
