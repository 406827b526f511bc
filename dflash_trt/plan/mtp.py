"""The MTP arm: what the target's own multi-token-prediction heads would give instead of DFlash.

Targets that ship MTP layers declare them in their config: ``num_nextn_predict_layers``
(DeepSeek-V3/V3.2, GLM-4.5+ MoE) or ``mtp_num_hidden_layers`` (Qwen3.5 / 3.6 / 3.8, inside
``text_config`` for the VLM checkpoints). TensorRT-LLM serves them with ``MTPDecodingConfig``
(``tensorrt_llm/llmapi/llm_args.py``: ``max_draft_len = num_nextn_predict_layers``; a
checkpoint with ONE MTP layer runs it EAGLE-style, the one layer reused for every draft token,
inside the target's own forward, ``spec_dec_mode`` MTP_EAGLE_ONE_MODEL; more layers run
"vanilla", one layer per draft token).

**Step model** (the same :class:`~dflash_trt.plan.perf_model.StepModel` terms): one step drafts
``N`` tokens through the MTP layer sequentially (each a forward over ``b`` tokens: one decoder
layer of the target's shape, the ``eh_proj`` fusing embedding and hidden state ``[H, 2H]``, and
the LM head) and verifies ``b x (N + 1)`` tokens, all in one scheduled forward::

    t_MTP(b, N) = step_s + F_target(b, N + 1) + N x F_mtp(b)
    speedup     = τ_MTP(N) x t_AR(b) / t_MTP(b, N)

**Acceptance.** Published MTP τ relative to DFlash's on the same target and block (FACTS §14,
DFlash2 blog, Aug 2026): Qwen3.5-4B thinking T=1 MTP 4.54 vs DFlash 4.92 (0.92); Qwen3.8-27B
block 8 MTP 4.28 vs DFlash2 4.80 (0.89). The arm takes their mean ratio times the plan's DFlash
τ at a block of 8 (7 draft tokens), geometric in the draft length beyond (acceptance does not
fall with concurrency: TensorRT-LLM PR #16914, SGLang PR #16818). LMSYS (Jun 2026) measured the
same ordering at c1 on Qwen3.5-397B-A17B, 8xB200: DFlash 875 tok/s, MTP 558, baseline 203.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dflash_trt.plan.acceptance import fit_alpha
from dflash_trt.plan.perf_model import Acceptance, StepModel

Arm = Literal["dflash", "mtp", "autoregressive"]

CONFIG_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")
# (MTP τ, DFlash τ) pairs, same target and block: FACTS §14 (DFlash2 blog, Aug 2026)
PUBLISHED = {"Qwen3.5-4B thinking T=1": (4.54, 4.92), "Qwen3.8-27B block 8": (4.28, 4.80)}
TAU_RATIO = sum(m / d for m, d in PUBLISHED.values()) / len(PUBLISHED)
PUBLISHED_DRAFT = 7  # the blog's block 8
MAX_DRAFT = 7  # the longest MTP draft the arm considers


def mtp_layers(cfg: dict) -> int:
    """MTP layers the (text) config declares; 0: none."""
    for src in (cfg, cfg.get("text_config") or {}):
        for key in CONFIG_KEYS:
            if isinstance(src.get(key), int) and src[key] > 0:
                return int(src[key])
    return 0


def mtp_layers_of(path: Path) -> int:
    """MTP layers of the checkpoint or config directory ``path`` (0: none, or no readable config)."""
    try:
        return mtp_layers(json.loads((Path(path) / "config.json").read_text()))
    except (OSError, ValueError):
        return 0


@dataclass(frozen=True)
class MtpArm:
    layers: int  # MTP layers in the checkpoint
    draft_len: int  # num_nextn_predict_layers written (= max_draft_len)
    acceptance: float  # τ_MTP at draft_len
    alpha: float

    def as_dict(self) -> dict:
        return {
            "layers": self.layers,
            "num_nextn_predict_layers": self.draft_len,
            "acceptance": round(self.acceptance, 3),
            "alpha": round(self.alpha, 4),
            "tau_ratio_to_dflash": round(TAU_RATIO, 3),
            "source": "FACTS §14: DFlash2 blog MTP/DFlash τ on Qwen3.5-4B and Qwen3.8-27B",
        }


def acceptance(dflash: Acceptance) -> Acceptance:
    """MTP's τ(N): the published ratio times DFlash's τ at 7 drafts, geometric in N."""
    tau = max(1.0 + 1e-6, TAU_RATIO * dflash.tau(PUBLISHED_DRAFT))
    return Acceptance(alpha=fit_alpha(tau, PUBLISHED_DRAFT + 1))


def mtp_forward(m: StepModel, b: int) -> float:
    """One pass of the MTP layer over ``b`` tokens: a target decoder layer, eh_proj, LM head."""
    t = m.target
    head = t.lm_head_params or t.embed_params
    layer_bytes = (m._weights_read(b, 1) * m.tp - 2 * head) / max(1, t.layers)  # per-layer share of the body
    extra = 2 * (2 * t.hidden * t.hidden + head)  # eh_proj + LM head, BF16
    memory = (layer_bytes / m.tp + extra / m.tp) / m._bandwidth()
    active = t.active_linear_params / max(1, t.layers)
    gemm = m._gemm(2 * b * (active + 2 * t.hidden * t.hidden + head) / m.tp, b, m.precision)
    attn = m._target_attention(b, 1) / max(1, t.layers)
    return max(memory, gemm) + attn + m._allreduces(2, b) + 2 * m.k.layer_s


def step(m: StepModel, b: int, n: int) -> float:
    if n <= 0:
        return m.ar_step(b)
    tables = getattr(m, "tables", None)  # plan.silicon: the tables' own MTP step, on one footing with DFlash's
    if tables is not None and tables.reason is None:
        return m.k.step_s + tables.mtp_step_ms(b, n, m.ctx) / 1000.0
    return m.k.step_s + m.target_forward(b, n + 1) + n * mtp_forward(m, b)


def speedup(m: StepModel, b: int, n: int, acc: Acceptance) -> float:
    if n <= 0:
        return 1.0
    return acc.tau(n) * m.ar_step(b) / step(m, b, n)


def plan_arm(m: StepModel, n_layers: int, dflash: Acceptance) -> MtpArm:
    """The MTP draft length that pays most at batch 1 (one layer: EAGLE-style, 1..7 drafts;
    several: vanilla, one draft per layer)."""
    acc = acceptance(dflash)
    if n_layers == 1:
        best = max(range(1, MAX_DRAFT + 1), key=lambda n: (round(speedup(m, 1, n, acc), 2), -n))
    else:
        best = n_layers
    return MtpArm(n_layers, best, acc.tau(best), acc.alpha)


def arm_winner(dflash: float, mtp: float | None) -> Arm:
    """Which arm a predicted (or measured) speedup over autoregressive makes the fastest."""
    arms: dict[Arm, float] = {"dflash": dflash, "autoregressive": 1.0}
    if mtp is not None:
        arms["mtp"] = mtp
    return max(arms, key=lambda a: arms[a])
