"""The DFlash2 family: DFlash plus dynamic convolutions and a candidate selector (no torch here).

A DFlash2 drafter (z-lab/Qwen3.8-27B-DFlash2, z-lab/Muse-Glimmer-30B-DFlash2; z-lab's ``dflash``
package, ``dflash/model.py``: ``DFlash2DraftModel``; vLLM PR #52816) is a z-lab drafter with four
more ``dflash_config`` sizes, all or none: ``conv_kernel_size`` and ``conv_group_size`` size the
grouped dynamic convolutions around every sublayer, ``selector_rank`` and ``selector_top_k`` the
candidate selector. Its published form keeps ``block_size`` inside ``dflash_config`` and
``is_causal`` at the top level (where the authors' ``Qwen3DFlashAttention`` reads it); the
codebooks are stored without a ``.weight`` suffix (a ``.weight`` suffix is accepted and dropped).
The module is ``model.dflash2.DFlash2Drafter``; the higher stages' hooks are
``runtime.proposer.SelectorProposer``, ``export.rounds.DFlash2Export``,
``plan.trtllm_dflash2.DFlash2Rules`` and ``train.objective.SelectorObjective``.
"""

from __future__ import annotations

from dflash_trt.errors import CheckpointError
from dflash_trt.model.family import PREFIXES, DrafterFamily, dflash_config, register_family

#: The ``dflash_config`` keys a DFlash2 drafter adds (all four, or none).
DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
#: The codebooks as published (no ``.weight``): the names ``DFlash2Drafter`` holds them under.
CODEBOOKS = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook")


class DFlash2Family(DrafterFamily):
    name = "dflash2"
    architecture = "DFlash2DraftModel"
    fields = DFLASH2_FIELDS
    module = "dflash_trt.model.dflash2:DFlash2Drafter"
    graph = "dflash2"

    def recognises(self, cfg, names):
        """The architecture, its dflash_config sizes, or its tensors."""
        return super().recognises(cfg, names) or any(
            n.startswith(p + "candidate_selector.") or ".attention_conv." in n for n in names for p in PREFIXES
        )

    def check_config(self, cfg):
        super().check_config(cfg)
        if cfg.hidden_size % cfg.conv_group_size:
            raise ValueError(f"conv_group_size {cfg.conv_group_size} does not divide hidden_size {cfg.hidden_size}")
        if cfg.selector_top_k > cfg.vocab_size:
            raise ValueError(f"selector_top_k {cfg.selector_top_k} exceeds the vocabulary ({cfg.vocab_size})")
        if cfg.draft_vocab_size:
            raise ValueError("DFlash2 selectors index the full vocabulary; a reduced draft vocabulary is not supported")

    def check_checkpoint(self, cfg, where):
        """The four sizes, present and consistent (one line each, before any tensor is read)."""
        d = dflash_config(cfg)
        missing = [k for k in self.fields if d.get(k) is None]
        if missing:
            raise CheckpointError(
                f"{where}: DFlash2 drafter config lacks dflash_config.{', '.join(missing)}; "
                "the convolutions and the candidate selector cannot be built without them"
            )
        super().check_checkpoint(cfg, where)
        hidden, group = cfg.get("hidden_size"), int(d["conv_group_size"])
        if isinstance(hidden, int) and hidden % group:
            raise CheckpointError(
                f"{where}: dflash_config.conv_group_size {group} does not divide hidden_size "
                f"{hidden}; the dynamic convolution shares one tap per group of channels"
            )
        vocab, top_k = cfg.get("vocab_size"), int(d["selector_top_k"])
        if isinstance(vocab, int) and top_k > vocab:
            raise CheckpointError(f"{where}: dflash_config.selector_top_k {top_k} exceeds the vocabulary ({vocab})")
        if d.get("draft_vocab_size"):
            raise CheckpointError(
                f"{where}: a DFlash2 selector indexes the full vocabulary; a reduced draft "
                "vocabulary (draft_vocab_size) is not supported"
            )

    def zlab_form(self, cfg, out):
        """The published form (z-lab/Qwen3.8-27B-DFlash2): the architecture, the four sizes and the
        block size in ``dflash_config``, ``is_causal`` at the top level."""
        super().zlab_form(cfg, out)
        dflash = out["dflash_config"]
        causal = dflash.pop("causal", None)
        if causal is not None:
            out["is_causal"] = causal
        dflash["block_size"] = cfg.block_size

    def tensor_name(self, name):
        if name.endswith(".weight") and name[: -len(".weight")] in CODEBOOKS:
            return name[: -len(".weight")]
        return name

    def expected_shapes(self, cfg):
        """The convolutions' and the selector's tensors under their published names (``dflash/model.py``)."""
        h, k, g, r = cfg.hidden_size, cfg.conv_kernel_size, cfg.hidden_size // cfg.conv_group_size, cfg.selector_rank
        out = {
            CODEBOOKS[0]: (cfg.vocab_size, r),
            CODEBOOKS[1]: (cfg.vocab_size, r),
            "candidate_selector.hidden_projection.weight": (r, h),
        }
        for n in range(cfg.num_hidden_layers):
            for conv in ("attention_conv", "mlp_conv"):
                out[f"layers.{n}.{conv}.base_kernel"] = (2, k, h)
                out[f"layers.{n}.{conv}.kernel_projection.weight"] = (2 * k * g, h)
        return out

    def check_tensors(self, missing, where):
        """Checked first: without its selector or convolutions the drafter is a different model."""
        extra = [n for n in missing if n.startswith("candidate_selector.") or "_conv." in n]
        if extra:
            part = "candidate selector" if extra[0].startswith("candidate_selector.") else "dynamic convolutions"
            raise CheckpointError(
                f"{where}: DFlash2 drafter weights lack the {part} ({extra[0]}, {len(extra)} "
                "missing); incomplete download, or a DFlash (v1) drafter labelled DFlash2"
            )

    def shape_counts(self, cfg, hidden, layers):
        """``DraftShape``'s convolution and selector counts. Per layer two DynamicConv (``base_kernel``
        [2, K, H], ``kernel_projection`` [2*K*(H/G), H]); one selector (predecessor and successor
        codebooks [V, r], ``hidden_projection`` [r, H]): the codebooks dominate (2*V*r, 127M at the
        published 27B drafter's V 248320, r 256). Incomplete sizes: nothing (ingest refuses them)."""
        d = dflash_config(cfg)
        K, G, r, k = (d.get(n) for n in self.fields)
        if not (K and G and r and k):
            return {}
        try:
            V = cfg["vocab_size"]
        except KeyError:
            raise CheckpointError(
                "DFlash2 drafter config lacks 'vocab_size' (its selector's codebooks are [V, r])"
            ) from None
        H = hidden
        return {
            "conv_params": layers * 2 * (2 * K * H + 2 * K * (H // G) * H),
            "selector_params": 2 * V * r + r * H,
            "selector_rank": int(r),
            "selector_top_k": int(k),
        }

    def pair_check(self, cfg, target_hidden, target_vocab):
        """The selector scores the target's top-k over the target's vocabulary: top-k fits in it, and
        the convolution groups tile the hidden size."""
        problems = []
        if cfg.selector_top_k > target_vocab:
            problems.append(f"selector_top_k {cfg.selector_top_k} exceeds the target's vocabulary {target_vocab}")
        if target_hidden % cfg.conv_group_size:
            problems.append(
                f"conv_group_size {cfg.conv_group_size} does not divide the target's hidden size {target_hidden}"
            )
        if problems:
            return "error", "; ".join(problems)
        return "ok", (
            f"convolutions: {cfg.conv_kernel_size} taps, groups of {cfg.conv_group_size}; selector: "
            f"rank {cfg.selector_rank}, top-{cfg.selector_top_k} of {target_vocab}"
        )


DFLASH2 = register_family(DFlash2Family())
