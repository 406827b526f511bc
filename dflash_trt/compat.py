"""Targets as read from disk, and whether a target and a drafter belong together.

Everything here works from config files and safetensors headers: no tensor is loaded,
so ``build --dry-run`` and planning for 120B models can call it, also on config-only
directories (``require_weights=False``: what needs weights is reported as absent).
Each failure is one line naming the file, what is wrong and what to do.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from dflash_trt import integrity
from dflash_trt.errors import CheckpointError, CompatibilityError
from dflash_trt.formats import flatten_rope

# Target architectures whose TensorRT-LLM PyTorch models capture hidden states for
# DFlash/EAGLE-3 (FACTS.md §3: Llama, Qwen3, Qwen3-MoE, Qwen3.5, GPT-OSS, Kimi, Laguna).
CAPTURE_ARCHITECTURES = {
    "LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
    "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM", "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration", "GptOssForCausalLM", "DeepseekV3ForCausalLM",
    "KimiK2ForCausalLM", "KimiK25ForConditionalGeneration", "LagunaForCausalLM",
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "spiece.model")
_LAYER = re.compile(r"(?:^|\.)(?:model|language_model)\.layers\.(\d+)\.")
_SCALE_SUFFIXES = ("_scale", "_scale_2", "_scales", "input_scale", "weight_scale")


def target_quantization(target_dir: str | Path) -> dict | None:
    """The quantization of a pre-quantized target, or None for plain BF16/FP16 weights.

    Reads ModelOpt's ``hf_quant_config.json`` first, then ``config.json``'s
    ``quantization_config`` (ModelOpt, MXFP4 as in gpt-oss, FP8, ...).
    """
    from dflash_trt.checkpoint import read_json

    root = Path(target_dir)
    hq = root / "hf_quant_config.json"
    if hq.exists():
        data = read_json(hq)
        q = data.get("quantization") or {}
        if q.get("quant_algo") or q.get("kv_cache_quant_algo"):
            return {"method": "modelopt", "quant_algo": q.get("quant_algo"),
                    "kv_cache_quant_algo": q.get("kv_cache_quant_algo"), "group_size": q.get("group_size"),
                    "exclude_modules": q.get("exclude_modules"), "producer": data.get("producer"),
                    "source": hq.name}
    cfg_path = root / "config.json"
    qc = read_json(cfg_path).get("quantization_config") if cfg_path.exists() else None
    if isinstance(qc, dict) and qc:
        method = qc.get("quant_method")
        algo = qc.get("quant_algo") or {"mxfp4": "MXFP4", "fp8": "FP8"}.get(str(method), method)
        kv = qc.get("kv_cache_quant_algo") or qc.get("kv_cache_scheme")
        return {"method": method, "quant_algo": str(algo).upper() if algo else None, "kv_cache_quant_algo": kv,
                "group_size": qc.get("group_size"),
                "exclude_modules": qc.get("exclude_modules") or qc.get("ignore") or qc.get("modules_to_not_convert"),
                "producer": qc.get("producer"), "source": "config.json"}
    return None


@dataclass
class TargetSpec:
    """A target model as read from disk (configs + safetensors headers)."""

    path: Path
    raw_config: dict
    architecture: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float | None
    rope_scaling: dict | None
    dtype: str | None
    quantization: dict | None
    tokenizer_files: list[str]
    weights: integrity.WeightSet
    embed_rows: int | None = None
    embed_tensor: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def capture_supported(self) -> bool:
        return self.architecture in CAPTURE_ARCHITECTURES

    @property
    def num_parameters(self) -> int | None:
        if not self.weights.present:
            return None
        packed = (self.quantization or {}).get("quant_algo") in ("NVFP4", "MXFP4")
        n = 0
        for name, t in self.weights.tensors.items():
            if name.endswith(_SCALE_SUFFIXES):
                continue
            n += t.numel * (2 if packed and t.dtype == "U8" else 1)
        return n

    def to_dict(self) -> dict:
        return {
            "path": str(self.path), "kind": "target", "format": "hf", "architecture": self.architecture,
            "model_type": self.model_type, "layers": self.num_layers, "hidden_size": self.hidden_size,
            "heads": self.num_attention_heads, "kv_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "vocab_size": self.vocab_size, "embedding_rows": self.embed_rows,
            "rope_theta": self.rope_theta, "rope_scaling": self.rope_scaling, "dtype": self.dtype,
            "stored_dtypes": sorted(self.weights.dtypes()), "quantization": self.quantization,
            "num_parameters": self.num_parameters, "bytes_on_disk": self.weights.bytes_on_disk,
            "weights_present": self.weights.present, "tokenizer_files": self.tokenizer_files,
            "hidden_state_capture": self.capture_supported, "warnings": self.warnings,
        }


def read_target(path: str | Path, require_weights: bool = True) -> TargetSpec:
    """Read a Hugging Face causal LM directory from its configs and safetensors headers."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from dflash_trt.checkpoint import open_dir, read_json

    path = open_dir(path, "Hugging Face model")
    where = path / "config.json"
    raw = read_json(where)
    if "dflash_config" in raw or "speculators_config" in raw or "speculators_model_type" in raw:
        raise CheckpointError(f"{where}: this is a DFlash drafter, not a target model; did you swap "
                              "--target and --drafter?")
    archs = [str(a) for a in raw.get("architectures") or []]
    model_type = str(raw.get("model_type") or "")
    if model_type not in CONFIG_MAPPING_NAMES or (archs and not hasattr(transformers, archs[0])):
        if raw.get("auto_map"):
            raise CheckpointError(f"{where}: {archs[0] if archs else model_type or 'this model'} is only defined "
                                  "by custom code in the checkpoint (auto_map), which dflash-trt never runs "
                                  "(trust_remote_code stays off); use a transformers-native architecture")
        if model_type not in CONFIG_MAPPING_NAMES:
            raise CheckpointError(f"{where}: unknown model_type {model_type or '(none)'!r} for transformers "
                                  f"{transformers.__version__}; upgrade transformers or use another model")
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    try:
        hidden, layers, heads = int(text["hidden_size"]), int(text["num_hidden_layers"]), int(text["num_attention_heads"])
        vocab = int(text.get("vocab_size") or raw["vocab_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{where}: missing or invalid {exc} (hidden_size, num_hidden_layers, "
                              "num_attention_heads, vocab_size are required)") from exc
    theta, scaling = flatten_rope(text)
    ws = integrity.scan(path, require=require_weights, what="target")
    spec = TargetSpec(
        path=path, raw_config=raw, architecture=archs[0] if archs else "?", model_type=model_type,
        num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        num_key_value_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=int(text.get("head_dim") or hidden // heads), vocab_size=vocab,
        rope_theta=theta, rope_scaling=scaling,
        dtype=text.get("dtype") or text.get("torch_dtype") or raw.get("dtype") or raw.get("torch_dtype"),
        quantization=target_quantization(path),
        tokenizer_files=sorted(p.name for p in path.iterdir()
                               if p.name in TOKENIZER_FILES or p.suffix == ".tiktoken"),
        weights=ws, warnings=list(ws.warnings),
    )
    if archs and not hasattr(transformers, archs[0]):
        spec.warnings.append(f"{where}: architecture {archs[0]} is not in transformers {transformers.__version__}; "
                             "the reference runtime may not load it")
    if spec.rope_theta is None:
        from dflash_trt.formats import _class_defaults

        base = _class_defaults(model_type)
        spec.rope_theta, spec.rope_scaling = base.get("rope_theta"), spec.rope_scaling or base.get("rope_scaling")
    if ws.present:
        _check_target_tensors(spec)
    return spec


def _check_target_tensors(spec: TargetSpec) -> None:
    names = [n for n in spec.weights.tensors if n.endswith("embed_tokens.weight")]
    if names:
        name = min(names, key=len)
        info = spec.weights.tensors[name]
        spec.embed_rows, spec.embed_tensor = info.shape[0], name
        if len(info.shape) == 2 and info.shape[1] != spec.hidden_size and info.dtype in integrity.FLOAT_DTYPES:
            raise CheckpointError(f"{spec.path / info.file}: {name} is {list(info.shape)} but config.json says "
                                  f"hidden_size {spec.hidden_size}; config and weights do not match")
        if info.shape[0] < spec.vocab_size:
            raise CheckpointError(f"{spec.path / info.file}: {name} has {info.shape[0]} rows but config.json "
                                  f"says vocab_size {spec.vocab_size}; config and weights do not match")
    found = {int(m.group(1)) for n in spec.weights.tensors if (m := _LAYER.search(n))}
    if found and max(found) + 1 < spec.num_layers:
        raise CheckpointError(f"{spec.path}: the weights hold decoder layers 0..{max(found)} but config.json says "
                              f"{spec.num_layers}; a shard is missing: download the checkpoint again")


# ---------------------------------------------------------------------------------------
# Pair validation
# ---------------------------------------------------------------------------------------


@dataclass
class PairReport:
    """The verdict on a (target, drafter) pair: every check, errors and warnings."""

    target: TargetSpec
    drafter: object  # checkpoint.DrafterSpec
    checks: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def add(self, check: str, status: str, detail: str) -> None:
        self.checks.append({"check": check, "status": status, "detail": detail})
        if status == "error":
            self.errors.append(detail)
        elif status == "warn":
            self.warnings.append(detail)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "errors": self.errors, "warnings": self.warnings, "checks": self.checks,
                "weights_present": {"target": self.target.weights.present,
                                    "drafter": self.drafter.weights.present}}


def _rope_equal(a: tuple, b: tuple) -> bool:
    (ta, sa), (tb, sb) = a, b
    if ta is None or tb is None or not math.isclose(ta, tb, rel_tol=1e-6):
        return False
    sa, sb = sa or {}, sb or {}
    kind = lambda s: s.get("rope_type", s.get("type", "default"))  # noqa: E731
    if kind(sa) != kind(sb):
        return False
    for k in set(sa) & set(sb) - {"rope_type", "type"}:
        x, y = sa[k], sb[k]
        same = math.isclose(x, y, rel_tol=1e-6) if isinstance(x, (int, float)) and isinstance(y, (int, float)) else x == y
        if not same:
            return False
    return True


def validate_pair(target_dir: str | Path, drafter_dir: str | Path, require_weights: bool = True,
                  raise_on_error: bool = True) -> PairReport:
    """Check that a drafter belongs to a target, from configs and safetensors headers alone.

    Unreadable/corrupt inputs raise ``CheckpointError``; a mismatched pair raises
    ``CompatibilityError`` with the first problem (``raise_on_error=False`` returns the
    report with ``.errors`` instead). Warnings are in ``.warnings``.
    """
    from dflash_trt.checkpoint import read_drafter

    t = read_target(target_dir, require_weights=require_weights)
    d = read_drafter(drafter_dir, require_weights=require_weights)
    r = PairReport(t, d)
    for w in t.warnings:
        r.add("target files", "warn", w)
    for w in d.warnings:
        r.add("drafter files", "warn", w)
    c = d.config
    dcfg, tcfg = d.path / "config.json", t.path / "config.json"

    if c.hidden_size == t.hidden_size:
        r.add("hidden size", "ok", f"{c.hidden_size}")
    else:
        r.add("hidden size", "error", f"{dcfg}: drafter hidden_size {c.hidden_size} != target hidden_size "
              f"{t.hidden_size} ({tcfg}); this drafter was trained for another target: use the one published for it")

    layout_d = (c.num_attention_heads, c.num_key_value_heads, c.head_dim)
    layout_t = (t.num_attention_heads, t.num_key_value_heads, t.head_dim)
    if layout_d == layout_t:
        r.add("head layout", "ok", "%d heads x %d, %d kv heads" % (layout_d[0], layout_d[2], layout_d[1]))
    else:
        r.add("head layout", "warn", f"{dcfg}: drafter heads {layout_d[0]}x{layout_d[2]} (kv {layout_d[1]}) differ "
              f"from the target's {layout_t[0]}x{layout_t[2]} (kv {layout_t[1]}); unusual for DFlash: check head_dim")

    if "vocab_size" in d.defaulted:
        d.config = c = c.model_copy(update={"vocab_size": t.vocab_size})
        r.add("vocabulary", "warn", f"{dcfg}: no vocab_size; assuming the target's {t.vocab_size}")
    elif c.vocab_size != t.vocab_size:
        r.add("vocabulary", "error", f"{dcfg}: drafter vocab_size {c.vocab_size} != target vocab_size "
              f"{t.vocab_size} ({tcfg}); the drafter was trained for another tokenizer")
    else:
        r.add("vocabulary", "ok", f"{c.vocab_size}" + (f", draft vocabulary {c.draft_vocab_size}"
                                                       if c.draft_vocab_size else ""))

    rows = t.embed_rows if t.embed_rows is not None else t.vocab_size
    src = f"{t.embed_tensor} in {t.weights.tensors[t.embed_tensor].file}" if t.embed_tensor else f"vocab_size, {tcfg}"
    if 0 <= c.mask_token_id < rows:
        r.add("mask token", "ok", f"id {c.mask_token_id} < {rows} embedding rows")
    else:
        r.add("mask token", "error", f"{dcfg}: mask_token_id {c.mask_token_id} has no row in the target's {rows}-row "
              f"embedding ({src}); the drafter belongs to another model family")

    ids, depth = list(c.target_layer_ids), t.num_layers
    bad = [i for i in ids if not 0 <= i < depth]
    if bad:
        if d.norm.layer_convention == "output_hidden_states":
            fix = (f" (published as aux_hidden_state_layer_ids {d.published_layer_ids}, shifted back by one); "
                   "the drafter was trained for a deeper target")
        elif max(ids) == depth:
            fix = ("; the largest id equals the depth, so these look like output_hidden_states indices (off by "
                   "one): z-lab ids count decoder layers from 0, subtract 1 in dflash_config.target_layer_ids")
        else:
            fix = "; the drafter was trained for a deeper target: use the drafter published for this model"
        r.add("target layer ids", "error", f"{dcfg}: target layer ids {bad} out of range for the {depth}-layer "
              f"target{fix}")
    else:
        r.add("target layer ids", "ok", f"{ids} of {depth} (output_hidden_states {[i + 1 for i in ids]})")
    if len(set(ids)) != len(ids):
        r.add("target layer ids", "warn", f"{dcfg}: target layer ids {ids} repeat a layer")

    if c.num_target_layers is None:
        r.add("target depth", "skip", "drafter config has no num_target_layers")
    elif c.num_target_layers != depth:
        r.add("target depth", "error", f"{dcfg}: num_target_layers {c.num_target_layers} != the target's depth "
              f"{depth} ({tcfg}); the drafter was trained on another model")
    else:
        r.add("target depth", "ok", f"{depth} layers")

    rope_d, rope_t = (c.rope_theta, c.rope_scaling), (t.rope_theta, t.rope_scaling)
    if _rope_equal(rope_d, rope_t):
        r.add("rope", "ok", f"theta {c.rope_theta:g}" + (f", {c.rope_scaling.get('rope_type')}" if c.rope_scaling else ""))
    else:
        msg = (f"{dcfg}: drafter RoPE (theta {c.rope_theta:g}, scaling {c.rope_scaling}) != target RoPE "
               f"(theta {t.rope_theta}, scaling {t.rope_scaling}) in {tcfg}")
        if "rope_theta" in d.defaulted:
            r.add("rope", "warn", msg + "; the drafter config omits rope_theta: set it to the target's")
        else:
            r.add("rope", "error", msg + "; DFlash drafters use the target's RoPE: fix the drafter config")

    ddt, tdt = d.dtype, str(t.dtype or "?")
    if t.quantization:
        q = t.quantization
        r.add("dtype", "ok", f"drafter {ddt}; target pre-quantized {q.get('quant_algo')} ({q.get('source')})")
    elif ddt == tdt:
        r.add("dtype", "ok", ddt)
    else:
        r.add("dtype", "warn", f"drafter weights are {ddt}, target computes in {tdt}; the drafter is cast at load")

    if t.tokenizer_files:
        r.add("tokenizer", "ok", ", ".join(t.tokenizer_files))
    elif not require_weights:
        r.add("tokenizer", "warn", f"{t.path}: tokenizer absent (config-only directory)")
    else:
        r.add("tokenizer", "error", f"{t.path}: no tokenizer files (tokenizer.json / tokenizer_config.json / "
              "tokenizer.model); copy the model's tokenizer into the target directory")

    if t.capture_supported:
        r.add("hidden-state capture", "ok", f"TensorRT-LLM captures hidden states for {t.architecture}")
    else:
        r.add("hidden-state capture", "warn", f"{tcfg}: TensorRT-LLM may not capture hidden states for "
              f"{t.architecture}; DFlash there is unverified (the reference runtime works)")
    if c.draft_vocab_size:
        r.add("draft head", "warn", f"{d.path}: reduced draft vocabulary ({c.draft_vocab_size}) with its own "
              "lm_head; TensorRT-LLM's DFlash loader uses the target's LM head instead, which destroys "
              "acceptance: serve this drafter with the reference runtime or use a full-vocabulary drafter")
    if raise_on_error and r.errors:
        more = f" (+{len(r.errors) - 1} more: see dflash-trt inspect --target)" if len(r.errors) > 1 else ""
        raise CompatibilityError(r.errors[0] + more)
    return r
