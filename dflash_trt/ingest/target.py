"""Targets as read from disk: configs and safetensors headers, no tensor loaded.

``read_target`` works on config-only directories too (``require_weights=False``), so planning
for 120B models needs no weights. ``target_quantization`` says how a pre-quantized target was
quantized (ModelOpt, MXFP4, FP8, ...). Each failure is one line naming the file.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from dflash_trt.errors import CheckpointError
from dflash_trt.ingest import files
from dflash_trt.ingest.formats import _class_defaults, flatten_rope
from dflash_trt.ingest.resolve import embedded_dir, open_dir, positive_int, read_json, transformers_names

# Whether TensorRT-LLM captures a target's hidden states is the release table's business:
# ``dflash_trt.plan.trtllm_capture`` (one row per family, read in TensorRT-LLM's source).


_LAYER = re.compile(r"(?:^|\.)(?:model|language_model)\.layers\.(\d+)\.")


_SCALE_SUFFIXES = ("_scale", "_scale_2", "_scales", "input_scale", "weight_scale")


_KV_SCHEME: dict[tuple[object, object], str] = {("float", 8): "FP8", ("float", 4): "NVFP4", ("int", 8): "INT8"}


def _kv_scheme_algo(scheme) -> str | None:
    """ModelOpt 1.x ``kv_cache_scheme`` ({"type": "float", "num_bits": 8} or "FP8") -> algo name."""
    if isinstance(scheme, str):
        return scheme.upper() if scheme.upper() in ("FP8", "NVFP4", "INT8") else None
    if isinstance(scheme, dict):
        return _KV_SCHEME.get((scheme.get("type"), scheme.get("num_bits")))
    return None


def _is_modelopt(raw: dict) -> bool:
    return (
        str(raw.get("quant_method", "")).lower().startswith("modelopt")
        or (raw.get("producer") or {}).get("name") == "modelopt"
    )


def read_modelopt_quant_config(raw: dict) -> dict | None:
    """Either ModelOpt ``hf_quant_config.json`` shape as the nested ``quantization`` dict
    (``quant_algo``, ``kv_cache_quant_algo``, ``group_size``, ``exclude_modules``), or None
    when ``raw`` is neither. The nested shape (ModelOpt 0.x) is ``{producer, quantization: {...}}``;
    ModelOpt >= 1.0 writes it flat: ``{producer, quant_method: modelopt, quant_algo, kv_cache_scheme,
    ignore, config_groups}``. Normalised as TensorRT-LLM does
    (``tensorrt_llm/quantization/modelopt_config.py::read_modelopt_quant_config``); a group size
    only in ``config_groups`` is taken from there."""
    if not isinstance(raw, dict):
        return None
    if isinstance(raw.get("quantization"), dict):
        return dict(raw["quantization"])
    if not _is_modelopt(raw):
        return None
    out = {
        k: v
        for k, v in raw.items()
        if k not in ("producer", "quant_method", "ignore", "kv_cache_scheme", "config_groups")
    }
    if "ignore" in raw:
        out["exclude_modules"] = raw["ignore"]
    out["kv_cache_quant_algo"] = _kv_scheme_algo(raw.get("kv_cache_scheme"))
    if out.get("group_size") is None:
        groups = [g for g in (raw.get("config_groups") or {}).values() if isinstance(g, dict)]
        sizes = {(g.get("weights") or {}).get("group_size") for g in groups} - {None}
        if len(sizes) == 1:
            out["group_size"] = sizes.pop()
    return out


def target_quantization(target_dir: str | Path, config: dict | None = None) -> dict | None:
    """The quantization of a pre-quantized target, or None for plain BF16/FP16 weights.

    Reads ModelOpt's ``hf_quant_config.json`` first (either shape), then ``config.json``'s
    ``quantization_config`` (ModelOpt, MXFP4 as in gpt-oss, FP8, ...); ``config``: that
    ``config.json`` as already read (a spec's ``raw_config``), so it is not read again.
    """
    root = Path(target_dir)
    hq = root / "hf_quant_config.json"
    if hq.exists():
        data = read_json(hq)
        q = read_modelopt_quant_config(data) or {}
        if q.get("quant_algo") or q.get("kv_cache_quant_algo"):
            return {
                "method": "modelopt",
                "quant_algo": q.get("quant_algo"),
                "kv_cache_quant_algo": q.get("kv_cache_quant_algo"),
                "group_size": q.get("group_size"),
                "exclude_modules": q.get("exclude_modules"),
                "producer": data.get("producer"),
                "source": hq.name,
            }
    cfg_path = root / "config.json"
    if config is None and cfg_path.exists():
        config = read_json(cfg_path)
    qc = (config or {}).get("quantization_config")
    if isinstance(qc, dict) and qc:
        method = qc.get("quant_method")
        algo = qc.get("quant_algo") or {"mxfp4": "MXFP4", "fp8": "FP8"}.get(str(method), method)
        kv = qc.get("kv_cache_quant_algo") or _kv_scheme_algo(qc.get("kv_cache_scheme")) or qc.get("kv_cache_scheme")
        return {
            "method": method,
            "quant_algo": str(algo).upper() if algo else None,
            "kv_cache_quant_algo": kv,
            "group_size": qc.get("group_size"),
            "exclude_modules": qc.get("exclude_modules") or qc.get("ignore") or qc.get("modules_to_not_convert"),
            "producer": qc.get("producer"),
            "source": "config.json",
        }
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
    weights: files.WeightSet
    embed_rows: int | None = None
    embed_tensor: str | None = None
    warnings: list[str] = field(default_factory=list)

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
            "path": str(self.path),
            "kind": "target",
            "format": "hf",
            "architecture": self.architecture,
            "model_type": self.model_type,
            "layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "heads": self.num_attention_heads,
            "kv_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "embedding_rows": self.embed_rows,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "dtype": self.dtype,
            "stored_dtypes": sorted(self.weights.dtypes()),
            "quantization": self.quantization,
            "num_parameters": self.num_parameters,
            "bytes_on_disk": self.weights.bytes_on_disk,
            "weights_present": self.weights.present,
            "tokenizer_files": self.tokenizer_files,
            "warnings": self.warnings,
        }


def _config_mapping_names():
    """transformers' model_type -> config class names, read without importing its config classes
    (``configuration_auto`` imports torch: reading a config directory must not); architectures
    are looked up in ``resolve.transformers_names()`` the same way."""
    try:  # transformers >= 5: the generated table the auto classes extend
        from transformers.models.auto.auto_mappings import CONFIG_MAPPING_NAMES  # start-up: transformers
    except ImportError:  # pragma: no cover - older transformers keep it in configuration_auto
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES  # start-up: transformers
    return CONFIG_MAPPING_NAMES


def read_target(path: str | Path, require_weights: bool = True) -> TargetSpec:
    """Read a Hugging Face causal LM directory from its configs and safetensors headers."""
    import transformers  # start-up: transformers

    path = open_dir(path, "Hugging Face model")
    where = path / "config.json"
    raw = read_json(where)
    archs, model_type = _architecture(raw, where)
    text: dict = raw["text_config"] if isinstance(raw.get("text_config"), dict) else raw
    size = lambda key, default=None: positive_int(text, key, where, default)  # noqa: E731
    hidden, layers, heads = size("hidden_size"), size("num_hidden_layers"), size("num_attention_heads")
    vocab = positive_int(text if "vocab_size" in text else raw, "vocab_size", where)
    kv_heads, head_dim = size("num_key_value_heads", heads), _head_dim(text, where, hidden // heads)
    theta, scaling = flatten_rope(text)
    _check_numbers(text, theta, where)
    ws = files.scan(path, require=require_weights, what="target")
    spec = TargetSpec(
        path=path,
        raw_config=raw,
        architecture=archs[0] if archs else "?",
        model_type=model_type,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        rope_theta=theta,
        rope_scaling=scaling,
        dtype=text.get("dtype") or text.get("torch_dtype") or raw.get("dtype") or raw.get("torch_dtype"),
        quantization=target_quantization(path, raw),
        tokenizer_files=files.tokenizer_files(path),
        weights=ws,
        warnings=list(ws.warnings),
    )
    if archs and archs[0] not in transformers_names():
        spec.warnings.append(
            f"{where}: architecture {archs[0]} is not in transformers {transformers.__version__}; "
            "the reference runtime may not load it"
        )
    if spec.rope_theta is None:
        base = _class_defaults(model_type)
        spec.rope_theta, spec.rope_scaling = base.get("rope_theta"), spec.rope_scaling or base.get("rope_scaling")
    if ws.present:
        _check_target_tensors(spec, model_code=require_weights or not _packaged(path))
    return spec


def _architecture(raw: dict, where: Path) -> tuple[list[str], str]:
    """The config's (architectures, model_type); a drafter, custom-code-only or unknown model is refused."""
    import transformers  # start-up: transformers

    CONFIG_MAPPING_NAMES = _config_mapping_names()
    if "dflash_config" in raw or "speculators_config" in raw or "speculators_model_type" in raw:
        raise CheckpointError(
            f"{where}: this is a DFlash drafter, not a target model; did you swap --target and --drafter?"
        )
    archs = [str(a) for a in raw.get("architectures") or []]
    model_type = str(raw.get("model_type") or "")
    if model_type not in CONFIG_MAPPING_NAMES or (archs and archs[0] not in transformers_names()):
        if raw.get("auto_map"):
            raise CheckpointError(
                f"{where}: {archs[0] if archs else model_type or 'this model'} is only defined "
                "by custom code in the checkpoint (auto_map), which dflash-trt never runs "
                "(trust_remote_code stays off); use a transformers-native architecture"
            )
        if model_type not in CONFIG_MAPPING_NAMES:
            raise CheckpointError(
                f"{where}: unknown model_type {model_type or '(none)'!r} for transformers "
                f"{transformers.__version__}; upgrade transformers or use another model"
            )
    return archs, model_type


# Config numbers the model computes with: each must be a finite number in its range, else the
# runtime runs and produces nonsense (an rms_norm_eps of 0 or a negative rope_theta).
_RANGES = {
    "rms_norm_eps": (0.0, 1.0),
    "layer_norm_eps": (0.0, 1.0),
    "layer_norm_epsilon": (0.0, 1.0),
    "initializer_range": (0.0, None),
    "attention_dropout": (-1e-12, 1.0),
}


def _check_numbers(text: dict, theta, where: Path) -> None:
    """One line for a config number that is not a number, not finite, or out of its range."""
    for key, (lo, hi) in {**_RANGES, "rope_theta": (0.0, None)}.items():
        value = theta if key == "rope_theta" else text.get(key)
        if value is None:
            continue
        ok = (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and value > lo
            and (hi is None or value <= hi)
            and abs(value) < 1e300
            and math.isfinite(value)
        )
        if not ok:
            rng = f"in ({lo:g}, {hi:g}]" if hi is not None else f"> {lo:g}"
            raise CheckpointError(f"{where}: {key} is {value!r}; it must be a finite number {rng}")
    mpe = text.get("max_position_embeddings")
    if mpe is not None:
        positive_int(text, "max_position_embeddings", where)


def _packaged(path: Path) -> bool:
    """Whether ``path`` is inside the installed package's embedded assets."""
    return Path(path).resolve().is_relative_to(embedded_dir("").resolve())


def _check_target_tensors(spec: TargetSpec, model_code: bool = True) -> None:
    """Tensor names and shapes against the config, from the safetensors headers; ``model_code``
    also builds the architecture on the meta device (torch) to check every unquantized shape:
    for every directory of the user's; the packaged embedded pair (checked by the project's tests)
    is read config-only where weights are not required, so ``plan tiny`` needs no torch."""
    names = [n for n in spec.weights.tensors if n.endswith("embed_tokens.weight")]
    if names:
        name = min(names, key=len)
        info = spec.weights.tensors[name]
        spec.embed_rows, spec.embed_tensor = info.shape[0], name
        if len(info.shape) == 2 and info.shape[1] != spec.hidden_size and info.dtype in files.FLOAT_DTYPES:
            raise CheckpointError(
                f"{spec.path / info.file}: {name} is {list(info.shape)} but config.json says "
                f"hidden_size {spec.hidden_size}; config and weights do not match"
            )
        if info.shape[0] < spec.vocab_size:
            raise CheckpointError(
                f"{spec.path / info.file}: {name} has {info.shape[0]} rows but config.json "
                f"says vocab_size {spec.vocab_size}; config and weights do not match"
            )
    found = {int(m.group(1)) for n in spec.weights.tensors if (m := _LAYER.search(n))}
    if found and max(found) + 1 < spec.num_layers:
        raise CheckpointError(
            f"{spec.path}: the weights hold decoder layers 0..{max(found)} but config.json says "
            f"{spec.num_layers}; a shard is missing: download the checkpoint again"
        )
    if spec.quantization is None and model_code:
        _check_unquantized(spec)


def _check_unquantized(spec: TargetSpec) -> None:
    """A target without a quantization config stores float weights, in the shapes its config implies."""
    meta = _meta_state(spec)
    ints = sorted(
        n
        for n, t in spec.weights.tensors.items()
        if _LAYER.search(n) and t.dtype not in files.FLOAT_DTYPES and not _integer_by_design(n, meta)
    )
    if ints:
        t = spec.weights.tensors[ints[0]]
        raise CheckpointError(
            f"{spec.path / t.file}: {ints[0]} is {t.dtype} but the target has no quantization "
            "config (ModelOpt hf_quant_config.json, compressed-tensors or MXFP4 "
            "quantization_config); refusing to run integer weights as floats"
        )
    expected = {k: tuple(v.shape) for k, v in meta.items()}
    for name, info in sorted(spec.weights.tensors.items()):
        want = expected.get(name)
        if want is not None and tuple(want) != tuple(info.shape):
            raise CheckpointError(
                f"{spec.path / info.file}: {name} is {list(info.shape)} but config.json implies "
                f"{list(want)}; config and weights do not match (a transposed or foreign tensor)"
            )


#: integer tables an architecture stores as such (not quantized weights), for when its meta model
#: cannot be built: DeepSeek V4's hash routing ``mlp.gate.tid2eid`` [vocab, top_k] (token -> experts).
INTEGER_TABLES = ("tid2eid",)


def _integer_by_design(name: str, meta: dict) -> bool:
    """Whether the architecture itself declares tensor ``name`` integer (a lookup table, not a weight)."""
    if name in meta:
        return not (meta[name].dtype.is_floating_point or meta[name].dtype.is_complex)
    return name.rsplit(".", 1)[-1] in INTEGER_TABLES


def _meta_state(spec: TargetSpec) -> dict:
    """The state dict of the config's architecture, built on the meta device (no memory, no weights)."""
    import torch  # start-up: torch
    import transformers  # start-up: transformers

    cls = getattr(transformers, spec.architecture, None)
    if cls is None:
        return {}
    try:
        # the config.json read_target read, not the file again (what AutoConfig.from_pretrained
        # does after reading it: the model_type's config class from the dict)
        cfg = transformers.CONFIG_MAPPING[spec.model_type].from_dict(dict(spec.raw_config))
        with torch.device("meta"):
            model = cls(cfg)
    except Exception:  # noqa: BLE001 - a config transformers cannot build is refused where it is loaded
        return {}
    return dict(model.state_dict())


def _head_dim(text: dict, where, default: int) -> int:
    """``head_dim``; 0 is what transformers writes for an MLA config without RoPE dims (glm5_next's
    position-free attention: ``qk_rope_head_dim: 0``), whose query/key head is then
    ``qk_nope_head_dim + qk_rope_head_dim``."""
    if text.get("head_dim") == 0 and "qk_nope_head_dim" in text:
        qk = {**text, "head_dim": int(text.get("qk_nope_head_dim") or 0) + int(text.get("qk_rope_head_dim") or 0)}
        return positive_int(qk, "head_dim", where)
    return positive_int(text, "head_dim", where, default)
