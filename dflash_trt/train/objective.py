"""DFlash drafter training: the paper's recipe, on top of the runtime's own modules.

Read top to bottom:

* :func:`drafter_config_for` derives a drafter's shape from any transformers causal LM
  (hidden size and head layout are the target's; the drafter has no embedding and no LM
  head: both are the target's, frozen).
* :func:`training_visibility` (``forward.py``) is the training mask. A sequence of T tokens
  with K anchors ``a_1..a_K`` becomes K blocks ``[x[a_k], MASK x (B-1)]``; block position t sits at
  absolute position ``a_k + t`` and predicts ``x[a_k + t]``. Block k sees the target
  context strictly before its anchor (positions ``< a_k``), its own block (bidirectional,
  or causal for causal layers), and never another block.
* :func:`train_forward` (``forward.py``) runs all K blocks of a batch in one dense masked
  attention, with the drafter's own submodules. It computes exactly what ``Drafter.inject`` followed by
  ``Drafter.draft`` compute at inference for the same prefix (``tests/train/test_train.py``
  holds it to that): context K/V come from ``k_proj``/``v_proj`` of
  ``hidden_norm(fc(target_hidden))`` with RoPE at the context tokens' absolute positions.
* :func:`block_loss`: cross-entropy of block positions 1..B-1 through the target's LM
  head, weighted ``exp(-(k-1)/gamma)``.
* A drafter family's training is its :class:`Objective` (the train stage's family hook,
  ``model.family`` documents the seam; :func:`objective_for` finds it): its ``--arch`` sizes and
  their defaults, its initialisation, and its extra loss. DFlash2 (``--arch dflash2``,
  :class:`SelectorObjective`) trains its convolutions inside the same forward (they are part of
  ``block_forward``) and adds :func:`selector_loss`: the selector's cross-entropy over the top-k
  candidates each position's logits propose, after the true predecessor, with the same weights.

The loop, data regeneration and checkpoints live in :mod:`dflash_trt.train.loop` and
:mod:`dflash_trt.train.data`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dflash_trt.errors import DFlashError
from dflash_trt.model import DFlash2Family, Drafter, DrafterConfig, DrafterFamily, drafter_for, family_named, hook_for
from dflash_trt.model import family_of as drafter_family
from dflash_trt.train.forward import train_forward as train_forward  # re-exported: objective's face
from dflash_trt.train.forward import training_visibility as training_visibility

# Loss decay from the paper (block size -> gamma); other sizes interpolate linearly.
GAMMA = {8: 4.0, 10: 5.0, 16: 7.0}


def loss_gamma(block_size: int) -> float:
    if block_size in GAMMA:
        return GAMMA[block_size]
    return max(1.0, 4.0 + 3.0 * (block_size - 8) / 8.0)


def default_layer_ids(num_layers: int, n_taps: int | None = None) -> list[int]:
    """Evenly spaced tap layers from 1 to depth-3 (gives z-lab's [1, 9, 17, 25, 33] for 36)."""
    if num_layers < 1:
        raise DFlashError("the target has no decoder layers")
    n_taps = n_taps or (5 if num_layers >= 20 else 3)
    lo = min(1, max(0, num_layers - 2))  # never the last layer (see drafter_config_for)
    hi = max(lo, num_layers - 3)
    if n_taps == 1:
        return [hi]
    ids = sorted({round(lo + (hi - lo) * i / (n_taps - 1)) for i in range(n_taps)})
    return ids


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def drafter_config_for(
    target_model,
    *,
    block_size: int = 16,
    layers: int = 1,
    target_layer_ids: list[int] | None = None,
    mask_token_id: int,
    family: str = "dflash",
    sizes: dict | None = None,
) -> DrafterConfig:
    """The drafter shape for a transformers causal LM (z-lab conventions). ``family``: the drafter
    family (``--arch``); ``sizes``: its fields (DFlash2: ``conv_kernel_size``, ``conv_group_size``,
    ``selector_rank``, ``selector_top_k``), checked against the target by its :class:`Objective`."""
    c = _text_config(target_model.config)
    n = int(c.num_hidden_layers)
    ids = list(target_layer_ids) if target_layer_ids else default_layer_ids(n)
    bad = [i for i in ids if not 0 <= i < n]
    if bad:
        raise DFlashError(f"--target-layer-ids {bad} out of range for a {n}-layer target (ids count from 0)")
    if n - 1 in ids and n > 1:
        # transformers returns the last layer's output after the final norm, TensorRT-LLM
        # captures it before: a drafter trained on it would not transfer to deployment.
        raise DFlashError(
            f"--target-layer-ids: the last layer ({n - 1}) cannot be tapped consistently "
            f"across runtimes; use ids up to {n - 2}"
        )
    vocab = target_model.get_input_embeddings().weight.shape[0]
    if not 0 <= mask_token_id < vocab:
        raise DFlashError(f"mask token id {mask_token_id} has no row in the target's {vocab}-row embedding")
    rope = getattr(c, "rope_parameters", None) or {}
    theta = rope.get("rope_theta") or getattr(c, "rope_theta", None) or 10000.0
    scaling = getattr(c, "rope_scaling", None) if not rope else rope
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    heads = int(c.num_attention_heads)
    fam = family_named(family)
    hook_for(OBJECTIVES, fam)().check_sizes(sizes or {}, int(c.hidden_size), vocab)
    typed = {k: v for k, v in (sizes or {}).items() if k in DrafterConfig.model_fields}
    own = {k: v for k, v in (sizes or {}).items() if k not in typed}
    return DrafterConfig(
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(c, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(c, "head_dim", None) or c.hidden_size // heads),
        vocab_size=vocab,
        block_size=block_size,
        mask_token_id=mask_token_id,
        target_layer_ids=ids,
        num_target_layers=n,
        rms_norm_eps=float(getattr(c, "rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        rope_scaling={k: v for k, v in scaling.items() if k != "rope_theta"} if scaling else None,
        max_position_embeddings=int(getattr(c, "max_position_embeddings", 40960)),
        attention_bias=bool(getattr(c, "attention_bias", False)),
        family=fam.name,
        family_fields=own,
        **typed,
    )


def init_drafter(cfg: DrafterConfig, seed: int = 0) -> Drafter:
    """A fresh drafter: linear weights N(0, 0.02), norms 1 (the Hugging Face init), then its family's
    :meth:`Objective.init`. Kernel projections (DFlash2's ``DynamicConv``) keep their zero init."""
    torch.manual_seed(seed)
    d = drafter_for(cfg)(cfg)
    for name, m in d.named_modules():
        if isinstance(m, torch.nn.Linear) and not name.endswith("kernel_projection"):
            torch.nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                torch.nn.init.zeros_(m.bias)
    objective_for(drafter_family(cfg)).init(d)
    return d.float()


def block_inputs(
    tokens: torch.Tensor, anchors: torch.Tensor, B: int, mask_id: int, lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block token ids [b, K, B] (anchor then MASK) and labels [b, K, B-1] (-100 past the end)."""
    b, K = anchors.shape
    block = torch.full((b, K, B), mask_id, dtype=torch.long, device=tokens.device)
    block[:, :, 0] = torch.gather(tokens, 1, anchors)
    pos = anchors[:, :, None] + torch.arange(1, B, device=tokens.device)  # [b, K, B-1]
    inside = pos < lengths[:, None, None]
    labels = torch.gather(tokens, 1, pos.clamp_max(tokens.shape[1] - 1).view(b, -1)).view(b, K, B - 1)
    return block, torch.where(inside, labels, -100)


def loss_weights(labels: torch.Tensor, gamma: float) -> torch.Tensor:
    """[b, K, B-1]: ``exp(-(k-1)/gamma)`` at block position k, 0 where there is no label."""
    k = torch.arange(labels.shape[-1], device=labels.device, dtype=torch.float32)
    return torch.exp(-k / gamma) * (labels >= 0)


def block_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    gamma: float,
    normaliser: float | None = None,
    picks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """Decay-weighted CE over block positions 1..B-1. logits [b, K, B-1, V]; labels [b, K, B-1].

    The weighted sum is divided by ``normaliser`` (default: this batch's total weight); data
    parallel ranks pass the global batch's, so their losses add up to the global loss.
    Also returns the batch's greedy agreement: per-position accuracy, the acceptance length
    tau a greedy verifier would see on these blocks (1 + accepted prefix), and its sum over
    the ``blocks`` it is the mean of (``tau_sum``, for averaging across ranks). ``picks``
    [b, K, B-1]: the tokens the drafter proposes (default each position's argmax; DFlash2 passes
    its selector's, :func:`selector_loss`).
    """
    Bm1 = labels.shape[-1]
    valid = labels >= 0
    ce = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), labels.clamp_min(0).reshape(-1), reduction="none"
    ).view_as(labels)
    weights = loss_weights(labels, gamma)
    total = weights.sum() if normaliser is None else torch.tensor(normaliser, dtype=torch.float32)
    loss = (ce * weights).sum() / total.to(ce.device).clamp_min(1e-9)
    with torch.no_grad():
        hit = ((logits.argmax(-1) if picks is None else picks) == labels) & valid
        full = valid.all(-1)  # blocks whose labels are all inside the sequence
        taus = 1.0 + hit[full].long().cumprod(-1).sum(-1).float()
        tau = taus.mean().item() if full.any() else math.nan
        acc = [(hit[..., k].sum() / valid[..., k].sum().clamp_min(1)).item() for k in range(Bm1)]
    return loss, {"tau": tau, "acc": acc, "tau_sum": taus.sum().item(), "blocks": int(full.sum())}


# ---------------------------------------------------------------------------------------
# DFlash2: the candidate selector
# ---------------------------------------------------------------------------------------


def selector_scores(
    drafter, hidden: torch.Tensor, logits: torch.Tensor, predecessors: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The selector's scores of each position's candidates after the given predecessor.

    hidden [..., H] the normed hidden states of draft positions; logits [..., V] their draft
    logits; predecessors [...] the token one position before each. Returns (scores [..., k]
    float32, candidates [..., k]): the formula ``plugins.selector_walk`` applies at every step of
    its walk (unary + <A[p] * h, B[c]>), here for all positions at once. The candidates are the
    top-k the layers propose; gradients reach the layers through the unary term and the hidden
    projection, and the codebooks through the bilinear one.
    """
    sel = drafter.candidate_selector
    unary, cand = torch.topk(logits.float(), sel.top_k, dim=-1)
    context = sel.predecessor_codebook[predecessors].float() * sel.hidden_projection(hidden).float()  # [..., r]
    pair = torch.einsum("...r,...kr->...k", context, sel.successor_codebook[cand].float())
    return unary + pair, cand


def selector_loss(
    drafter,
    hidden: torch.Tensor,
    logits: torch.Tensor,
    block: torch.Tensor,
    labels: torch.Tensor,
    gamma: float,
    normaliser: float | None = None,
):
    """DFlash2's selector term of the block objective, and the tokens its greedy walk proposes.

    hidden [b, K, B-1, H], logits [b, K, B-1, V] (draft positions 1..B-1), block [b, K, B] the
    block's input ids (the anchor at 0), labels [b, K, B-1]. Teacher forcing: position t's
    predecessor is the true token at t-1 (the anchor at t = 1), which is what the walk holds
    whenever t is reached with every earlier draft accepted, the only case in which t's choice
    counts. Each position's loss is the cross-entropy of its label among the k candidates the
    layers propose, decay-weighted as :func:`block_loss`, over the positions whose label is a
    candidate (the walk cannot pick another); divided by ``normaliser`` (default: the batch's
    weight). Returns (loss, picks [b, K, B-1]: the walk's greedy choice at each position).
    """
    predecessors = torch.cat([block[..., :1], labels[..., :-1].clamp_min(0)], dim=-1)
    scores, cand = selector_scores(drafter, hidden, logits, predecessors)
    is_label = cand == labels[..., None]  # [b, K, B-1, k]
    present = is_label.any(-1) & (labels >= 0)
    ce = F.cross_entropy(
        scores.reshape(-1, scores.shape[-1]), is_label.float().argmax(-1).reshape(-1), reduction="none"
    ).view_as(labels)
    weights = loss_weights(labels, gamma)
    total = weights.sum() if normaliser is None else torch.tensor(normaliser, dtype=torch.float32)
    loss = (ce * weights * present).sum() / total.to(ce.device).clamp_min(1e-9)
    picks = cand.gather(-1, scores.argmax(-1, keepdim=True))[..., 0]
    return loss, picks.detach()


# ---------------------------------------------------------------------------------------
# The family hook: each drafter family's sizes, initialisation and extra loss
# ---------------------------------------------------------------------------------------


class Objective:
    """DFlash: no sizes of its own, the Hugging Face init, the block loss alone."""

    #: the family's sizes ``--arch`` takes (DrafterConfig fields) and their defaults
    defaults: dict[str, int] = {}

    def check_sizes(self, sizes: dict, hidden: int, vocab: int) -> None:
        """Refuse sizes the target cannot take, each in one line naming its flag (default: any)."""

    def init(self, drafter: Drafter) -> None:
        """Initialise what the generic init does not (default: nothing)."""

    def extra_loss(
        self,
        drafter,
        hidden: torch.Tensor,
        logits: torch.Tensor,
        block: torch.Tensor,
        labels: torch.Tensor,
        gamma: float,
        normaliser: float | None = None,
    ):
        """(a loss term added to :func:`block_loss`, the tokens the drafter proposes [b, K, B-1]), each
        None when the family adds nothing (the default). Arguments as :func:`selector_loss`."""
        return None, None


class SelectorObjective(Objective):
    """DFlash2: the four sizes, random codebooks, the selector's term (:func:`selector_loss`)."""

    #: those of z-lab/Qwen3.8-27B-DFlash2's config.json
    defaults = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}

    def check_sizes(self, sizes, hidden, vocab):
        if hidden % sizes["conv_group_size"]:
            raise DFlashError(
                f"--conv-group-size {sizes['conv_group_size']} does not divide the target's hidden "
                f"size {hidden} (each group of channels shares one dynamic tap)"
            )
        if not 2 <= sizes["selector_top_k"] <= vocab:
            raise DFlashError(
                f"--selector-top-k {sizes['selector_top_k']} must be between 2 and the vocabulary "
                f"({vocab}): the selector chooses among that many candidates"
            )

    def init(self, drafter):
        """The convolutions start as the identity (``DynamicConv``'s init), so the fresh drafter computes
        its DFlash backbone; the codebooks N(0, 0.02) like the linear weights (two zero codebooks would
        get no gradient: each one's is proportional to the other)."""
        torch.nn.init.normal_(drafter.candidate_selector.predecessor_codebook, std=0.02)
        torch.nn.init.normal_(drafter.candidate_selector.successor_codebook, std=0.02)

    def extra_loss(self, drafter, hidden, logits, block, labels, gamma, normaliser=None):
        """The selector picks among the candidates the logits propose."""
        return selector_loss(drafter, hidden, logits, block, labels, gamma, normaliser)


#: family class -> its objective class (``register``; found up the family's hierarchy by ``objective_for``)
OBJECTIVES: dict[type, type[Objective]] = {DrafterFamily: Objective, DFlash2Family: SelectorObjective}


def register(family: type[DrafterFamily], objective: type[Objective]) -> None:
    """Train ``family`` (and its subclasses without their own) with ``objective``."""
    OBJECTIVES[family] = objective


def objective_for(family: DrafterFamily) -> Objective:
    """The training objective of ``family`` (the nearest registered up its class hierarchy)."""
    return hook_for(OBJECTIVES, family)()
