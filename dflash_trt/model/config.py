"""DrafterConfig: the one in-memory description every drafter format normalises to.

z-lab conventions throughout: ``target_layer_ids`` count decoder layers from 0 (layer id
``i`` is the output of decoder layer ``i``, i.e. ``output_hidden_states[i + 1]``).
``checkpoint``/``formats`` map the published formats onto it; ``to_zlab`` writes the form
TensorRT-LLM's DFlash loader reads.

Every drafter family (``family.py``) shares this description: ``family`` names it (set once, at
validation: from the fields set when not given) and the family's own ``dflash_config`` fields
are read here. DFlash2's four (``conv_kernel_size``, ``conv_group_size``, ``selector_rank``,
``selector_top_k``; ``family_dflash2.py``) are typed fields below; a family's other fields go in
``family_fields``. :meth:`DrafterConfig.field` reads either.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dflash_trt.model import family as families

LayerType = Literal["full_attention", "sliding_attention"]


def flatten_rope(cfg: dict) -> tuple[float | None, dict | None]:
    """(rope_theta, rope_scaling) from either transformers 4 keys or 5's ``rope_parameters``."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and params:
        params = dict(params)
        theta = params.pop("rope_theta", cfg.get("rope_theta"))
        kind = params.get("rope_type", params.get("type", "default"))
        return _number(theta), (params if kind != "default" else None)
    theta = cfg.get("rope_theta")
    scaling = cfg.get("rope_scaling")
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) == "default":
        scaling = None
    return _number(theta), (scaling or None)


def _number(value: Any) -> Any:
    """``value`` as a float, or as it is when it is none (a list, a 309-digit integer): the config
    checks then name it in one line instead of ``float()`` raising here."""
    if value is None or isinstance(value, bool):
        return value
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return value


class DrafterConfig(BaseModel):
    """Normalised drafter description (z-lab conventions: layer id i = output of layer i)."""

    model_config = ConfigDict(extra="forbid")

    hidden_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    num_hidden_layers: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_key_value_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0, description="The target's vocabulary size.")
    block_size: int = Field(16, ge=1, description="Block B: anchor + B-1 masked positions.")
    mask_token_id: int = Field(ge=0)
    target_layer_ids: list[int] = Field(min_length=1)
    num_target_layers: int | None = Field(None, description="Depth of the target it was trained on.")
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 40960
    attention_bias: bool = False
    hidden_act: Literal["silu"] = "silu"
    layer_types: list[LayerType] | None = None
    sliding_window: int | None = None
    causal: bool | None = Field(
        None,
        description="Force every layer causal (True) or bidirectional (False); "
        "None: sliding layers causal, full layers bidirectional (the z-lab default).",
    )
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    draft_vocab_size: int | None = Field(
        None, description="Reduced draft vocabulary with its own lm_head and d2t map (speculators)."
    )
    dtype: str = "bfloat16"
    # -- the family -------------------------------------------------------------------------
    family: str | None = Field(
        None,
        description="The drafter family (``model.family``); None: inferred from the fields set, once, at validation.",
    )
    family_fields: dict[str, Any] = Field(
        default_factory=dict, description="The family's own dflash_config fields that are not fields here."
    )
    # DFlash2's (all four set, or none)
    conv_kernel_size: int | None = Field(None, ge=1, description="DFlash2: taps of each dynamic convolution.")
    conv_group_size: int | None = Field(None, ge=1, description="DFlash2: channels sharing one dynamic tap.")
    selector_rank: int | None = Field(None, ge=1, description="DFlash2: rank of the selector's codebooks.")
    selector_top_k: int | None = Field(None, ge=1, description="DFlash2: candidates per block position.")

    def field(self, name: str) -> Any:
        """A family field's value: a typed field of this config, else ``family_fields`` (None: unset)."""
        if name in type(self).model_fields:
            return getattr(self, name)
        return self.family_fields.get(name)

    @model_validator(mode="after")
    def _check(self) -> DrafterConfig:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.layer_types is None:  # normalise: one explicit entry per layer
            object.__setattr__(self, "layer_types", ["full_attention"] * self.num_hidden_layers)
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError("layer_types must have one entry per drafter layer")
        if "sliding_attention" in (self.layer_types or []) and not self.sliding_window:
            raise ValueError("sliding_attention layers need a sliding_window")
        if self.family is None:
            object.__setattr__(self, "family", families.infer(self).name)
        try:
            family = families.family_named(self.family)
        except KeyError as exc:
            raise ValueError(str(exc.args[0])) from None
        others = {n for f in families.FAMILIES.values() for n in f.fields} - set(family.fields)
        stray = sorted(n for n in others if self.field(n) is not None)
        if stray:
            raise ValueError(f"{', '.join(stray)} belong to another drafter family than {family.name}")
        family.check_config(self)
        return self

    def layer_causal(self, i: int) -> bool:
        if self.causal is not None:
            return self.causal
        return self.layer_window(i) is not None

    def layer_window(self, i: int) -> int | None:
        if self.layer_types and self.layer_types[i] == "sliding_attention":
            return self.sliding_window
        return None

    # -- z-lab form ------------------------------------------------------------------
    @classmethod
    def from_zlab(cls, cfg: dict) -> DrafterConfig:
        """Read a z-lab ``config.json`` (v1: top-level block_size; newer: inside dflash_config)."""
        dcfg = cfg.get("dflash_config") or {}
        family = families.recognise_family(cfg, [])
        values = family.read_fields(dcfg)
        typed = {k: (int(v) if v is not None else None) for k, v in values.items() if k in cls.model_fields}
        own = {k: v for k, v in values.items() if k not in cls.model_fields and v is not None}

        def pick(name, default=None):
            return dcfg.get(name, cfg.get(name, default))

        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        theta, scaling = flatten_rope(cfg)  # transformers 5 writes rope_parameters, 4 rope_theta/rope_scaling
        window = pick("swa_window_size") or cfg.get("sliding_window")
        layer_types = cfg.get("layer_types")
        if pick("use_swa") and not layer_types:
            layer_types = ["sliding_attention"] * cfg["num_hidden_layers"]
        if layer_types and "sliding_attention" not in layer_types:
            window = None
        return cls(
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=cfg["num_attention_heads"],
            num_key_value_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
            head_dim=head_dim,
            vocab_size=cfg["vocab_size"],
            block_size=int(pick("block_size", 16)),
            mask_token_id=pick("mask_token_id"),
            target_layer_ids=list(pick("target_layer_ids")),
            num_target_layers=cfg.get("num_target_layers"),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=theta if theta is not None else 1_000_000.0,
            rope_scaling=scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 40960),
            attention_bias=bool(cfg.get("attention_bias", False)),
            layer_types=layer_types,
            sliding_window=window,
            causal=pick("causal", pick("is_causal")),
            input_embedding_scale=float(pick("input_embedding_scale", 1.0)),
            output_multiplier=float(pick("output_multiplier", 1.0)),
            final_logit_softcapping=pick("final_logit_softcapping"),
            draft_vocab_size=pick("draft_vocab_size"),
            dtype=str(cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"),
            family=family.name,
            family_fields=own,
            **typed,
        )

    def to_zlab(self) -> dict:
        """The ``config.json`` TensorRT-LLM's DFlash loader and the z-lab code read."""
        dflash = {"mask_token_id": self.mask_token_id, "target_layer_ids": self.target_layer_ids}
        for name in (
            "causal",
            "input_embedding_scale",
            "output_multiplier",
            "final_logit_softcapping",
            "draft_vocab_size",
        ):
            value = getattr(self, name)
            if value is not None and value != DrafterConfig.model_fields[name].default:
                dflash[name] = value
        cfg = {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "block_size": self.block_size,
            "dflash_config": dflash,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "hidden_act": self.hidden_act,
            "layer_types": self.layer_types,
            "sliding_window": self.sliding_window,
            "use_sliding_window": self.sliding_window is not None,
            "tie_word_embeddings": False,
            "dtype": self.dtype,
        }
        if self.num_target_layers is not None:
            cfg["num_target_layers"] = self.num_target_layers
        families.family_of(self).zlab_form(self, cfg)
        return cfg
