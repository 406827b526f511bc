"""Published DFlash drafter formats, recognised from their config and tensor names.

Every supported format normalises to one z-lab-style config dict (read by
``DrafterConfig.from_zlab``) plus a tensor-name map onto the z-lab names ``Drafter`` uses.

| format      | recognised by                                   | differences from z-lab                          |
|-------------|--------------------------------------------------|-------------------------------------------------|
| zlab-v1     | ``dflash_config``, top-level ``block_size``      | none (the reference form)                       |
| zlab        | ``block_size`` inside ``dflash_config``          | ``layer_types``/SWA/``causal`` flags            |
| modelopt    | z-lab config + ``hf_quant_config.json`` /        | tensors may carry a ``model.`` or               |
|             | modelopt ``quantization_config`` / name prefix   | ``dflash_module.`` prefix; ``use_swa`` = all    |
| speculators | ``speculators_model_type: dflash``               | decoder config nested in                        |
|             |                                                  | ``transformer_layer_config``; layer ids are     |
|             |                                                  | ``output_hidden_states`` indices (z-lab id + 1);|
|             |                                                  | reduced vocab: own ``lm_head`` + ``d2t`` offsets|
| dflash2     | ``DFlash2DraftModel`` / ``dflash_config``        | z-lab form plus ``conv_kernel_size``,           |
|             | ``conv_kernel_size`` / selector tensors          | ``conv_group_size``, ``selector_rank``,         |
|             |                                                  | ``selector_top_k``; ``is_causal`` top level;    |
|             |                                                  | conv + ``candidate_selector.*`` tensors         |

speculators (vllm-project/speculators, ``train/vocab_mapping.py``): ``d2t[i]`` is an
*offset*, target id = ``i + d2t[i]``; ``t2d`` is a boolean mask over the target
vocabulary with exactly ``draft_vocab_size`` set entries, the draft ids being the set
target ids in increasing order. ``Drafter.d2t`` holds *absolute* target ids, so the
offsets are added here. Its converter from z-lab writes ``aux_hidden_state_layer_ids =
target_layer_ids + 1`` and vLLM maps back with ``- 1``: the shift is undone here (TensorRT-LLM
reads the z-lab ids: ``deploy.trtllm_config.check_layer_ids`` refuses the +1 ones). speculators
0.9 trains every layer sliding (``window=(W-1, W-1)``) and non-causal unless
``sliding_window_non_causal: false``: an absent key reads as non-causal (``causal: false`` in the
z-lab form), and the per-layer windows must be one window shared by every sliding layer.

Drafter families other than DFlash (DFlash2, ...) are recognised, checked and renamed by their
``model.DrafterFamily`` (``recognises``, ``check_checkpoint``, ``tensor_name``,
``expected_shapes``): the format is the family's name and its form is z-lab's. DFlash2
(``model/family_dflash2.py``): the published codebooks are stored as
``candidate_selector.predecessor_codebook`` / ``successor_codebook`` (no ``.weight``; the authors'
loader maps them onto ``nn.Embedding``); a ``.weight`` suffix is accepted and dropped.

Which format a checkpoint is in, and the refusal of every other drafter family by name:
:mod:`dflash_trt.ingest.format_detect`. Refused here: drafters with quantized weights
(:func:`check_quantized`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from dflash_trt.errors import CheckpointError
from dflash_trt.ingest import format_guards
from dflash_trt.ingest.files import FLOAT_DTYPES, TensorInfo
from dflash_trt.ingest.format_detect import _dcfg, detect
from dflash_trt.ingest.resolve import positive_int
from dflash_trt.model import family_named, family_of, flatten_rope, recognise_family

# Tensors some exports carry that DFlash takes from the target (or recomputes): dropped.
TARGET_OWNED = {"embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight"}


@dataclass
class Normalised:
    """How one published drafter maps onto the z-lab form."""

    format: str
    zlab: dict  # config.json in z-lab form (input of DrafterConfig.from_zlab)
    published_layer_ids: list[int]  # as written in the checkpoint
    layer_convention: str  # "zlab" (decoder layer i) or "output_hidden_states" (i + 1)
    prefix: str = ""  # stripped from every tensor name
    d2t_offsets: bool = False  # speculators: d2t holds offsets, not absolute ids
    defaulted: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    family: str = "dflash"  # the drafter family (``model.DrafterFamily``) whose tensors these are

    def rename(self, name: str) -> str | None:
        """The z-lab name of a published tensor, or None when it is not the drafter's."""
        if self.prefix:
            if not name.startswith(self.prefix):
                return None
            name = name[len(self.prefix) :]
        if name in TARGET_OWNED or name.startswith("rotary_emb.") or name == "t2d":
            return None
        if name == "lm_head.weight" and not self.zlab["dflash_config"].get("draft_vocab_size"):
            return None
        return family_named(self.family).tensor_name(name)


def _prefix(names: list[str], where: str) -> str:
    if not names or "fc.weight" in names:
        return ""
    for n in names:
        if n.endswith(".fc.weight"):
            return n[: -len("fc.weight")]
    raise CheckpointError(f"{where}: no fc.weight tensor; these are not DFlash drafter weights")


def _class_defaults(model_type: str) -> dict:
    """Defaults of the transformers config class the drafter's loaders instantiate."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # start-up: transformers

    try:
        c = CONFIG_MAPPING[model_type]()
    except Exception:  # noqa: BLE001 - unknown or picky config class: no defaults
        return {}
    # to_dict, not getattr: a heterogeneous config (gemma-4: head_dim per layer type) raises on
    # the global read of a per-layer attribute.
    full = c.to_dict()
    d = {
        k: full.get(k)
        for k in (
            "head_dim",
            "rms_norm_eps",
            "max_position_embeddings",
            "vocab_size",
            "intermediate_size",
            "attention_bias",
        )
    }
    theta, scaling = flatten_rope(full)
    d.update(rope_theta=theta, rope_scaling=scaling)
    return {k: v for k, v in d.items() if v is not None}


def _zlab(cfg: dict, names: list[str], root: Path, fmt: str) -> Normalised:
    where = str(root / "config.json")
    d = dict(_dcfg(cfg))
    for key in ("mask_token_id", "target_layer_ids"):
        if d.get(key, cfg.get(key)) is None:
            raise CheckpointError(f"{where}: dflash_config.{key} is missing; the drafter cannot be used without it")
    z = {k: v for k, v in cfg.items() if k not in ("rope_parameters", "auto_map", "quantization_config")}
    defaulted: list[str] = []
    notes: list[str] = []
    theta, scaling = flatten_rope(cfg)
    z["rope_theta"], z["rope_scaling"] = theta, scaling
    keys = ("head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings", "vocab_size", "intermediate_size")
    # the config class (and with it torch) only when a field is missing: a complete config reads torch-free
    base = _class_defaults(str(cfg.get("model_type") or "qwen3")) if any(z.get(k) is None for k in keys) else {}
    for key in keys:
        if z.get(key) is None and key in base:
            z[key] = base[key]
            defaulted.append(key)
            if key == "rope_theta" and z.get("rope_scaling") is None:
                z["rope_scaling"] = base.get("rope_scaling")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        positive_int(z, key, where)
    for key in ("num_key_value_heads", "head_dim", "vocab_size"):
        if z.get(key) is not None:
            positive_int(z, key, where)
    if d.get("block_size") is None and cfg.get("block_size") is None:
        defaulted.append("block_size")
    n = int(z["num_hidden_layers"])
    types = z.get("layer_types")
    if d.get("use_swa") and (not types or set(types) == {"full_attention"}):
        # ModelOpt writes use_swa with all-"full" layer_types meaning: every layer slides.
        z["layer_types"] = ["sliding_attention"] * n
        z["sliding_window"] = d.get("swa_window_size") or cfg.get("sliding_window")
        notes.append("use_swa: every draft layer uses a sliding window")
    z["dflash_config"] = d
    prefix = _prefix(names, where)
    if prefix:
        notes.append(f"tensor prefix {prefix!r} stripped")
    ids = d.get("target_layer_ids") or cfg.get("target_layer_ids")
    if not ids:
        raise CheckpointError(f"{where}: no target_layer_ids (the target layers the drafter reads)")
    return Normalised(fmt, z, list(ids), "zlab", prefix=prefix, defaulted=defaulted, notes=notes)


def _speculators(cfg: dict, names: list[str], root: Path) -> Normalised:
    """A vllm-project/speculators DFlash checkpoint in z-lab form (see the module doc)."""
    where = str(root / "config.json")
    full = _speculators_decoder(cfg, where)
    aux, vocab, draft_vocab = _speculators_ids(cfg, full, where)
    z = _speculators_zlab(cfg, full, aux, vocab, draft_vocab)
    notes = [
        f"aux_hidden_state_layer_ids {aux} (output_hidden_states indices) -> z-lab ids "
        f"{z['dflash_config']['target_layer_ids']}"
    ]
    if draft_vocab < vocab:
        notes.append(f"reduced draft vocabulary {draft_vocab}/{vocab}: the drafter keeps its own lm_head and d2t")
    verifier = (cfg.get("speculators_config") or {}).get("verifier") or {}
    if verifier.get("name_or_path"):
        notes.append(f"trained against {verifier['name_or_path']}")
    return Normalised(
        "speculators", z, list(aux), "output_hidden_states", prefix=_prefix(names, where), d2t_offsets=True, notes=notes
    )


def _speculators_decoder(cfg: dict, where: str) -> dict:
    """The full transformers config of the nested ``transformer_layer_config`` (defaults filled in)."""
    from transformers import AutoConfig  # start-up: transformers

    tl = cfg.get("transformer_layer_config")
    if not isinstance(tl, dict):
        raise CheckpointError(f"{where}: speculators config without transformer_layer_config")
    for flag in ("sample_from_anchor", "shift_label"):
        if cfg.get(flag):
            raise CheckpointError(
                f"{where}: {flag}=true changes what each block position predicts; "
                "only standard DFlash drafters are supported"
            )
    tl = _one_window(tl, f"{where}: transformer_layer_config")
    model_type = str(tl.get("model_type") or "qwen3")
    try:
        full = AutoConfig.for_model(model_type, **{k: v for k, v in tl.items() if k != "model_type"}).to_dict()
        # transformers' Qwen3Config drops the window unless use_sliding_window: keep the published one
        return {**full, "sliding_window": tl["sliding_window"]}
    except (KeyError, ValueError, TypeError) as exc:
        raise CheckpointError(
            f"{where}: transformer_layer_config (model_type {model_type!r}) is not a "
            f"transformers config: {str(exc).splitlines()[0]}"
        ) from exc


def _speculators_ids(cfg: dict, full: dict, where: str) -> tuple[list[int], int, int]:
    """(aux_hidden_state_layer_ids, vocab size, draft vocab size), refusing what z-lab cannot express."""
    aux = cfg.get("aux_hidden_state_layer_ids")
    if not aux:
        raise CheckpointError(f"{where}: aux_hidden_state_layer_ids is missing")
    if min(aux) < 1:
        raise CheckpointError(
            f"{where}: aux_hidden_state_layer_ids {aux} include 0 (the embedding output), "
            "which the z-lab/TensorRT-LLM convention cannot express"
        )
    if cfg.get("mask_token_id") is None:
        raise CheckpointError(f"{where}: mask_token_id is missing")
    hidden = full["hidden_size"]
    if cfg.get("target_hidden_size") not in (None, hidden):
        raise CheckpointError(
            f"{where}: target_hidden_size {cfg['target_hidden_size']} != drafter hidden_size "
            f"{hidden}; cross-size drafters are not supported"
        )
    vocab = int(full["vocab_size"])
    draft_vocab = int(cfg.get("draft_vocab_size") or vocab)
    if not 0 < draft_vocab <= vocab:
        raise CheckpointError(f"{where}: draft_vocab_size {draft_vocab} outside 1..{vocab} (the vocabulary)")
    return aux, vocab, draft_vocab


def _one_window(tl: dict, where: str) -> dict:
    """``transformer_layer_config`` with one ``sliding_window`` for every sliding layer: the z-lab form,
    the runtime and TensorRT-LLM's DFlash path take one window; a per-layer list must hold one value
    over the sliding layers (full layers' entries are ignored), and sliding layers need a window."""
    window, types = tl.get("sliding_window"), list(tl.get("layer_types") or [])
    if isinstance(window, list):
        if types and len(window) != len(types):
            raise CheckpointError(f"{where}: {len(window)} per-layer sliding windows for {len(types)} layers")
        sizes = {
            w
            for w, t in zip(window, types or ["sliding_attention"] * len(window), strict=True)
            if t == "sliding_attention" and w
        }
        if len(sizes) > 1:
            raise CheckpointError(
                f"{where}: per-layer sliding windows {sorted(sizes)} differ; the runtime and "
                "TensorRT-LLM's DFlash path take one window for every sliding layer"
            )
        window = sizes.pop() if sizes else None
    if "sliding_attention" in types and not window:
        raise CheckpointError(f"{where}: sliding_attention layers without a sliding_window")
    return {**tl, "sliding_window": window}


def _speculators_zlab(cfg: dict, full: dict, aux: list[int], vocab: int, draft_vocab: int) -> dict:
    """The z-lab config.json: layer ids shifted back by one, the decoder fields flattened."""
    hidden = full["hidden_size"]
    theta, scaling = flatten_rope(full)
    types = full.get("layer_types")
    sliding = bool(types and "sliding_attention" in types)
    dflash = {"mask_token_id": cfg["mask_token_id"], "target_layer_ids": [a - 1 for a in aux]}
    # speculators 0.9 trains every layer sliding and non-causal unless told otherwise: an absent
    # ``sliding_window_non_causal`` reads as True (vLLM's speculators converter does the same,
    # ``test_dflash_speculators_config_defaults_to_non_causal_swa``); ``false`` keeps z-lab's causal windows.
    if sliding and cfg.get("sliding_window_non_causal", True):
        dflash["causal"] = False  # sliding layers bidirectional inside their window; full layers always are
    if draft_vocab < vocab:
        dflash["draft_vocab_size"] = int(draft_vocab)
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": int(cfg.get("block_size") or 8),
        "dflash_config": dflash,
        "hidden_size": hidden,
        "intermediate_size": full["intermediate_size"],
        "num_hidden_layers": full["num_hidden_layers"],
        "num_attention_heads": full["num_attention_heads"],
        "num_key_value_heads": full.get("num_key_value_heads") or full["num_attention_heads"],
        "head_dim": full.get("head_dim") or hidden // full["num_attention_heads"],
        "vocab_size": vocab,
        "rms_norm_eps": full.get("rms_norm_eps", 1e-6),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "max_position_embeddings": full.get("max_position_embeddings", 40960),
        "attention_bias": bool(full.get("attention_bias", False)),
        "layer_types": types,
        "sliding_window": full.get("sliding_window") if sliding else None,
        "dtype": full.get("dtype")
        or full.get("torch_dtype")
        or cfg.get("torch_dtype")
        or cfg.get("dtype")
        or "bfloat16",
    }


def normalise(cfg: dict, names: list[str], root: Path) -> Normalised:
    fmt = detect(cfg, names, root)
    if fmt == "speculators":
        return _speculators(cfg, names, root)
    family = recognise_family(cfg, names)
    family.check_checkpoint(cfg, root / "config.json")
    cfg = dict(cfg)
    alias = format_guards.nemo_alias(cfg)
    norm = _zlab(cfg, names, root, fmt)
    norm.family, norm.notes = family.name, norm.notes + alias
    if family.name != "dflash":  # its architecture: DrafterConfig.from_zlab then finds it without the tensors
        norm.zlab["architectures"] = [family.architecture]
    return norm


def check_quantized(tensors: dict[str, TensorInfo], cfg: dict, root: Path) -> None:
    """Refuse drafters stored in FP8/NVFP4 (the runtime and TensorRT-LLM expect BF16 drafters)."""
    quant = [n for n, t in tensors.items() if t.dtype not in FLOAT_DTYPES and n.split(".")[-1] not in ("d2t", "t2d")]
    algo = None
    qpath = root / "hf_quant_config.json"
    if qpath.exists():
        try:
            algo = (json.loads(qpath.read_text()).get("quantization") or {}).get("quant_algo")
        except ValueError:
            algo = "unreadable"
    if quant or algo:
        what = algo or tensors[quant[0]].dtype
        raise CheckpointError(
            f"{root}: quantized drafter ({what}); DFlash drafters must stay BF16, as peers keep "
            "them (SGLang --speculative-draft-model-quantization unquant; vLLM issue #51581): use "
            "the unquantized drafter (quantize the target instead)"
        )


def expected_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of a z-lab drafter with DrafterConfig ``cfg`` (what Drafter holds)."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    out = {"fc.weight": (h, len(cfg.target_layer_ids) * h), "hidden_norm.weight": (h,), "norm.weight": (h,)}
    for n in range(cfg.num_hidden_layers):
        p = f"layers.{n}."
        out.update(
            {
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
                p + "self_attn.q_norm.weight": (d,),
                p + "self_attn.k_norm.weight": (d,),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
            }
        )
        if cfg.attention_bias:
            out.update(
                {
                    p + "self_attn.q_proj.bias": (q,),
                    p + "self_attn.k_proj.bias": (kv,),
                    p + "self_attn.v_proj.bias": (kv,),
                    p + "self_attn.o_proj.bias": (h,),
                }
            )
    if cfg.draft_vocab_size:
        out["lm_head.weight"] = (cfg.draft_vocab_size, h)
        out["d2t"] = (cfg.draft_vocab_size,)
    out.update(family_of(cfg).expected_shapes(cfg))
    return out
