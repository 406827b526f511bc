"""The planner's step model: how long one decode step takes, with and without DFlash drafting.

A serving stack runs in *steps*: every live sequence advances once per step. Without drafting a
step is one target forward over ``b`` sequences x 1 token; with DFlash it is one drafter forward
and one target forward that verifies ``b x (L + 1)`` tokens and commits τ(L) tokens per sequence
on average. Everything below is per tensor-parallel rank (``tp``), at a typical decode context of
``S`` tokens per sequence. Terms, each with why it is there:

* **Fixed cost per forward** (``step_s``, per stack): scheduling the batch, sampling or argmax,
  the host-device sync that decides the next step, kernel launches outside the layers. It does
  not shrink with the model, so it is what makes small models gain less than their τ: an
  autoregressive step pays it once, a DFlash round twice (drafter, then target).
* **Cost per layer** (``layer_s``, per stack): launches and the small kernels of every decoder
  layer (norms, RoPE, residuals, cache writes). CUDA graphs make it microseconds; eager PyTorch
  (Transformers, the reference runtime) tens of microseconds or more.
* **Weights and KV streamed from memory** at ``bandwidth_share`` x the datasheet bandwidth
  (per stack): every weight but the input embedding is read once per forward (a tied LM head
  reads the embedding matrix); each sequence's context K/V is read once per forward, whatever
  its number of query tokens (flash attention streams the cache per query block).
* **MoE experts touched**: a forward over ``M`` tokens reads only the experts some token picked,
  expected fraction ``1 - (1 - k/E)^M``. A decode step (``M = b``) touches few experts and a
  verify step (``M = b x (L + 1)``) many, which is why MoE speedups stay flat as batches grow:
  the verify pays for experts the decode step would soon pay for too.
* **GEMMs whose efficiency depends on the tokens per forward**: ``2 x M x P`` FLOPs at
  ``compute_share`` (per stack) x the precision's peak x ``M / (max(M, 64) + 32)``: a GEMM over
  16 rows computes a whole 64-row tile (a quarter of the peak a GEMM over 2,048 rows reaches);
  an MoE's expert GEMMs, a few scattered rows per expert, run at ``moe_gemm_efficiency`` of a
  dense GEMM's rate, which is what makes a wide verify expensive for an MoE. A forward takes
  ``max(memory time, GEMM + attention time)``.
* **Attention over the context** for the ``b x (L + 1)`` query tokens, a kernel of its own:
  ``max(K/V read, 4 x M x S x heads x head_dim FLOPs per layer)``, the FLOPs at the tile
  efficiency of the ``(L + 1) x heads / kv_heads`` query rows each KV head serves (BF16): a
  decode step reads the cache, a wide verify over a long context computes.
* **The drafter forward**: its layers over the block of ``b x (L + 1)`` tokens; the KV injection
  of the tokens committed last round (``b x τ`` target hidden states through ``fc`` and each
  draft layer's ``k_proj``/``v_proj``, DFlash paper arXiv 2602.06036 §3); its context K/V read;
  the target's BF16 LM head over the ``b x L`` draft positions. Split over ranks like the target
  (TensorRT-LLM runs the one-model drafter with the target's mapping).
* **Tensor-parallel all-reduces**: two per layer (after attention and after the MLP), each
  ``allreduce_s`` plus ``2 (tp - 1) / tp x M x hidden x 2 B`` over the GPU link.
* **τ as a function of the draft length** (:class:`Acceptance`): from per-position acceptance
  rates where they are known (``τ(L) = 1 + p_1 + ... + p_L``, ``p_k`` the share of rounds that
  accept draft position k, as ``bench`` reports them), a single geometric α otherwise
  (``τ(L) = 1 + α + ... + α^L``).

Then, for a batch of ``b`` sequences::

    t_AR(b)      = step_s + F_target(b, 1)
    t_DFlash(b,L) = 2 step_s + F_draft(b, L) + F_target(b, L + 1)
    speedup(b,L) = τ(L) x t_AR(b) / t_DFlash(b, L)
    tokens/s per user = τ(L) / t_DFlash(b, L)   (1 / t_AR(b) without drafting)

The per-stack constants are fitted against published measurements
(``bench/fit_perf_model.py``, :mod:`dflash_trt.plan.perf_fit`); the shared ones below are fixed
(:class:`Shared`, each with its source).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

from dflash_trt.errors import DFlashError
from dflash_trt.plan.acceptance import expected_tau, fit_alpha
from dflash_trt.plan.hardware import GPU
from dflash_trt.plan.model_shapes import DraftShape, TargetShape

# GPU-to-GPU link per GPU, GB/s, one direction (NVIDIA datasheets: NVLink 5 on Blackwell, NVLink 4
# on Hopper, NVLink 3 on A100; PCIe Gen5 x16 where a card has no NVLink). Host: memory copies.
LINK_GBS = {
    "B300": 900,
    "B200": 900,
    "GB200": 900,
    "H200": 450,
    "H100": 450,
    "H100 PCIe": 64,
    "L40S": 32,
    "A100 80GB": 300,
    "A100 40GB": 300,
    "RTX PRO 6000 Blackwell": 64,
    "cpu": 10,
}
#: the serving software a measurement or calibration row came from (its "stack")
STACKS = ("trtllm", "sglang", "vllm", "transformers", "reference")
CALIBRATION_FILE = "calibration.json"


@dataclass(frozen=True)
class StackConstants:
    """What one serving stack achieves on one class of hardware (fitted; see the module docstring)."""

    bandwidth_share: float = 0.8  # of the datasheet memory bandwidth, streaming weights and KV
    compute_share: float = 0.6  # of the dense tensor-core peak, for a large GEMM
    step_s: float = 50e-6  # fixed per forward: scheduling, sampling, sync, launches
    layer_s: float = 5e-6  # per decoder layer per forward

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Shared:
    """Constants every stack shares (not fitted: the published rows cannot tell them apart)."""

    # A tensor-core GEMM over M token rows computes whole tiles of ``gemm_tile_rows`` rows (the M of
    # Hopper's wgmma and of the usual CUTLASS/cuBLAS tiles is 64) and loses a tail of waves and
    # epilogue worth ``gemm_tail_rows`` more: efficiency M / (max(M, tile) + tail) of the stack's
    # compute share (NVIDIA "Matrix Multiplication Background" guide: tile and wave quantisation).
    gemm_tile_rows: float = 64.0
    gemm_tail_rows: float = 32.0
    allreduce_s: float = 8e-6  # one small NCCL all-reduce inside an NVLink domain (NCCL tests, ~8 us)
    # Consecutive tokens of one sequence often pick the same experts (Mixtral of Experts, arXiv
    # 2401.04088, section 5 "Routing analysis"): n tokens of one sequence touch about as many
    # experts as n^locality independent tokens.
    expert_locality: float = 0.5
    # Grouped expert GEMMs (fused MoE kernels) run a few rows per expert, scattered: they reach a
    # small fraction of a dense GEMM's rate (SGLang/vLLM ``fused_moe`` Triton kernels, TensorRT-LLM's
    # grouped GEMMs); fitted with the locality on the MoE rows.
    moe_gemm_efficiency: float = 0.1
    # 4-bit weights on a GPU without FP4 tensor cores (MXFP4 on Hopper) are dequantised to BF16
    # inside the GEMM (TensorRT-LLM's gpt-oss guide: the Triton MoE backend, W4A16 on Hopper),
    # which costs ALU time per weight: a further factor on their GEMM rate.
    dequant_efficiency: float = 0.7
    link_share: float = 0.7  # of LINK_GBS achieved by NCCL's ring all-reduce on small messages


@dataclass(frozen=True)
class Acceptance:
    """τ(L): per-position acceptance rates where known, a geometric α beyond them."""

    alpha: float
    per_position: tuple[float, ...] = ()  # p_k: share of rounds accepting draft position k (k = 1..)

    @classmethod
    def from_tau(cls, tau: float, block: int, per_position: list[float] | tuple[float, ...] | None = None):
        return cls(alpha=fit_alpha(tau, block), per_position=tuple(per_position or ()))

    def tau(self, draft_len: int) -> float:
        if not self.per_position:
            return expected_tau(self.alpha, draft_len)
        p = list(self.per_position[:draft_len])
        last = p[-1] if p else 1.0
        while len(p) < draft_len:  # beyond the measured positions: geometric in alpha
            last *= self.alpha
            p.append(last)
        return 1.0 + sum(p)


@dataclass(frozen=True)
class Calibration:
    """Fitted constants per stack, where they came from, and how many rows each rests on."""

    stacks: dict[str, StackConstants]
    shared: Shared = Shared()
    source: str = "defaults"  # what the constants were fitted on
    rows: dict[str, dict[str, int]] = field(default_factory=dict)  # stack -> constant -> rows

    def constants(self, stack: str) -> StackConstants:
        if stack in self.stacks:
            return self.stacks[stack]
        raise DFlashError(f"no calibration for stack {stack!r}; calibrated: {', '.join(self.stacks)}")

    def with_stack(self, stack: str, k: StackConstants, source: str, rows: dict[str, int]) -> Calibration:
        stacks = {**self.stacks, stack: k}
        return Calibration(stacks, self.shared, source, {**self.rows, stack: rows})

    def describe(self, stack: str) -> str:
        k, n = self.constants(stack), self.rows.get(stack, {})
        lo, hi = (min(n.values()), max(n.values())) if n else (0, 0)
        rows = f"{lo}" if lo == hi else f"{lo}-{hi}"
        return (
            f"{stack} calibration ({self.source}; {rows} measurement rows per constant): bandwidth "
            f"{k.bandwidth_share:.0%}, compute {k.compute_share:.0%}, {k.step_s * 1e6:.0f} us per forward, "
            f"{k.layer_s * 1e6:.1f} us per layer"
        )

    def as_dict(self) -> dict:
        return {
            "source": self.source,
            "shared": asdict(self.shared),
            "stacks": {e: k.as_dict() for e, k in self.stacks.items()},
            "rows": self.rows,
        }

    @classmethod
    def from_dict(cls, data: dict, where: str = "calibration") -> Calibration:
        try:
            stacks = {e: StackConstants(**k) for e, k in data["stacks"].items()}
            return cls(
                stacks,
                Shared(**data.get("shared", {})),
                str(data.get("source", where)),
                {e: {c: int(n) for c, n in r.items()} for e, r in data.get("rows", {}).items()},
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise DFlashError(f"{where}: not a dflash-trt calibration ({exc})") from None

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.as_dict(), indent=2) + "\n")


def data_dir() -> Path:
    """``dflash_trt/assets/perf``: the published measurements and the constants fitted on them."""
    return Path(str(resources.files("dflash_trt") / "assets" / "perf"))


def shipped_calibration() -> Calibration:
    """The constants fitted on the published measurements (``bench/fit_perf_model.py`` writes them)."""
    f = data_dir() / CALIBRATION_FILE
    if not f.is_file():
        return Calibration({e: StackConstants() for e in STACKS})
    return Calibration.from_dict(json.loads(f.read_text()), where=str(f))


def stack_for(gpu: GPU) -> str:
    """The stack a plan is for: TensorRT-LLM on a GPU, the reference runtime on the host."""
    return "reference" if gpu.kind == "cpu" else "trtllm"


@dataclass(frozen=True)
class StepModel:
    """Step times of one deployment (see the module docstring for every term).

    ``weights_bytes`` is the target's weight bytes at its precision (``plan.weight_bytes``);
    ``ctx`` the decode context S per sequence; times are seconds.
    """

    target: TargetShape
    drafter: DraftShape
    gpu: GPU
    precision: str
    kv_cache: str
    tp: int
    ctx: int
    k: StackConstants
    weights_bytes: int
    shared: Shared = Shared()

    # --- pieces ---------------------------------------------------------------------------
    def _bandwidth(self) -> float:
        return self.k.bandwidth_share * self.gpu.bandwidth

    def _gemm(self, flops: float, tokens: float, precision: str, grouped: bool = False) -> float:
        """Seconds for ``flops`` of GEMM over ``tokens`` rows: efficiency rises with the rows."""
        if tokens <= 0 or flops <= 0:
            return 0.0
        dequant = self.shared.dequant_efficiency if self._dequantizes(precision) else 1.0
        if grouped:  # a few rows per expert: the fused kernels' rate, whatever the rows
            eff = self.k.compute_share * self.shared.moe_gemm_efficiency
        elif self.gpu.kind == "cpu":  # CPU GEMMs (oneDNN/MKL) have no tensor-core tile to fill
            eff = self.k.compute_share
        else:
            eff = self.k.compute_share * tokens / (max(tokens, self.shared.gemm_tile_rows) + self.shared.gemm_tail_rows)
        return flops / (eff * dequant * self.gpu.peak_flops(precision))

    def _dequantizes(self, precision: str) -> bool:
        return precision == "mxfp4" and self.gpu.kind == "gpu" and self.gpu.sm < 100

    def _allreduces(self, count: int, tokens: int) -> float:
        if self.tp <= 1:
            return 0.0
        link = self.shared.link_share * LINK_GBS.get(self.gpu.name, 64) * 1e9
        size = 2 * (self.tp - 1) / self.tp * tokens * self.target.hidden * 2
        return count * (self.shared.allreduce_s + size / link)

    def _touched(self, b: int, n: int) -> float:
        """Expected share of each layer's experts a forward over ``b`` sequences x ``n`` tokens picks."""
        t = self.target
        independent = b * n**self.shared.expert_locality
        return 1 - (1 - t.experts_per_token / t.experts) ** independent

    def _weights_read(self, b: int, n: int) -> float:
        """Target weight bytes one forward over ``b x n`` tokens streams, per rank."""
        t = self.target
        total: float = self.weights_bytes - 2 * t.embed_params + (2 * t.embed_params if not t.lm_head_params else 0)
        total -= 2 * getattr(t, "vision_params", 0)  # a VLM's vision tower is never read in decode
        if t.experts:
            share = t.expert_params / max(1, t.linear_params)
            total = total * (1 - share) + total * share * self._touched(b, n)
        return total / self.tp

    def _target_gemms(self, b: int, n: int) -> float:
        """Dense GEMMs at the forward's token rows; expert GEMMs at the rows each expert gets."""
        t = self.target
        tokens = b * n
        head = t.lm_head_params or t.embed_params
        expert_active = t.expert_params * t.experts_per_token / t.experts if t.experts else 0
        dense = self._gemm(
            2 * tokens * (t.active_linear_params - expert_active + head) / self.tp, tokens, self.precision
        )
        if not t.experts:
            return dense
        return dense + self._gemm(2 * tokens * expert_active / self.tp, tokens, self.precision, grouped=True)

    # --- forwards -------------------------------------------------------------------------
    def _attention(
        self, b: int, n: int, ctx: int, heads: int, kv_heads: int, head_dim: int, layers: int, kv_bytes: int
    ) -> float:
        """Attention of ``b x n`` queries over ``ctx`` cached tokens each, every layer caching K/V
        for the whole context (the drafter's case)."""
        kv = b * ctx * 2 * layers * math.ceil(kv_heads / self.tp) * head_dim * kv_bytes
        flops = 4 * b * n * ctx * heads * head_dim * layers / self.tp
        return self._attention_time(kv, flops, n, heads, kv_heads)

    def _target_attention(self, b: int, n: int) -> float:
        """The target's attention through its own cache layout (``TargetShape.sequence_bytes`` /
        ``attention_flops``: sliding windows, MLA's compressed KV, linear-attention layers' fixed
        states); for a plain decoder the same as :meth:`_attention`."""
        t = self.target
        kv = b * t.sequence_bytes(self.tp, self.kv_cache, self.ctx)
        flops = t.attention_flops(b * n, self.ctx) / self.tp
        return self._attention_time(kv, flops, n, t.heads, t.kv_heads)

    def _attention_time(self, kv: float, flops: float, n: int, heads: int, kv_heads: int) -> float:
        """The K/V read, or the FLOPs at the tile efficiency of the ``n x heads / kv_heads`` query
        rows per KV head, whichever is longer."""
        rows = n * heads / max(1, kv_heads)
        eff = self.k.compute_share * (
            1.0
            if self.gpu.kind == "cpu"
            else rows / (max(rows, self.shared.gemm_tile_rows) + self.shared.gemm_tail_rows)
        )
        return max(kv / self._bandwidth(), flops / (eff * self.gpu.peak_flops("bf16")))

    def target_forward(self, b: int, n: int) -> float:
        """One target forward over ``b`` sequences x ``n`` new tokens: the GEMMs (weights read or
        FLOPs, whichever is longer), then attention (K/V read or FLOPs): separate kernels."""
        t = self.target
        linear = max(self._weights_read(b, n) / self._bandwidth(), self._target_gemms(b, n))
        attn = self._target_attention(b, n)
        return linear + attn + self._allreduces(2 * t.layers, b * n) + self.k.layer_s * t.layers

    def draft_forward(self, b: int, draft_len: int, tau: float) -> float:
        """The drafter: KV injection of ``b x τ`` committed tokens, the block of ``b x (L + 1)``
        tokens through its layers (a DFlash2 drafter's convolutions included), the target's BF16
        LM head over ``b x L`` positions, and a DFlash2 drafter's candidate selector over them."""
        d, t = self.drafter, self.target
        block, inject, head_rows = b * (draft_len + 1), b * tau, b * draft_len
        kv_proj = d.layers * 2 * d.hidden * d.kv_heads * d.head_dim
        fc = d.n_taps * d.hidden * d.hidden
        layer_params = max(0, d.params - fc - 2 * d.hidden - d.selector_params)
        # DFlash2's selector: the codebooks [V, r] are gathered (k + 1 rows per drafted position:
        # the candidates' successors and the predecessor), not streamed; the walk scores K x k
        # candidates at rank r after the hidden projection [r, H] (small next to the LM head).
        codebook_bytes = 2 * (d.selector_params - d.selector_rank * d.hidden)
        gathered = 2 * head_rows * (d.selector_top_k + 1) * d.selector_rank
        selector_flops = 2 * head_rows * d.selector_rank * (d.hidden + d.selector_top_k)
        memory = (d.bytes - codebook_bytes + gathered + 2 * t.vocab * t.hidden) / self.tp / self._bandwidth()
        gemm = (
            self._gemm(2 * block * layer_params / self.tp, block, "bf16")
            + self._gemm(2 * inject * (fc + kv_proj) / self.tp, inject, "bf16")
            + self._gemm((2 * head_rows * t.vocab * t.hidden + selector_flops) / self.tp, head_rows, "bf16")
        )
        attn = self._attention(b, draft_len + 1, self.ctx + draft_len + 1, d.heads, d.kv_heads, d.head_dim, d.layers, 2)
        return (
            max(memory, gemm) + attn + self._allreduces(2 * d.layers, block) + self.k.layer_s * (d.layers + 1)
        )  # + 1: injection fc and the LM head's launches

    # --- steps ----------------------------------------------------------------------------
    def ar_step(self, b: int) -> float:
        return self.k.step_s + self.target_forward(b, 1)

    def dflash_step(self, b: int, draft_len: int, tau: float) -> float:
        if draft_len <= 0:
            return self.ar_step(b)
        return 2 * self.k.step_s + self.draft_forward(b, draft_len, tau) + self.target_forward(b, draft_len + 1)

    def per_user(self, b: int, draft_len: int, acc: Acceptance) -> float:
        """Tokens/s each of ``b`` sequences sees (``draft_len`` 0: no drafting)."""
        if draft_len <= 0:
            return 1.0 / self.ar_step(b)
        tau = acc.tau(draft_len)
        return tau / self.dflash_step(b, draft_len, tau)

    def speedup(self, b: int, draft_len: int, acc: Acceptance | float) -> float:
        """DFlash over autoregressive at batch ``b`` (``acc``: an Acceptance, or a geometric α)."""
        acc = acc if isinstance(acc, Acceptance) else Acceptance(alpha=float(acc))
        return self.per_user(b, draft_len, acc) * self.ar_step(b)
