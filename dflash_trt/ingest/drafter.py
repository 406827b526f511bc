"""Drafters in every published format: read, loaded, written back in the z-lab form.

* :func:`read_drafter` reads a drafter from its configs and safetensors *headers* only:
  format, normalised :class:`~dflash_trt.model.DrafterConfig`, tensor shapes checked.
* :func:`load_drafter` loads the weights of any supported format into a ``Drafter``.
* :func:`write_zlab` writes the normalised z-lab form TensorRT-LLM loads.
Formats and their differences are documented in ``formats.py``; on-disk checks in
``files.py``; whether a target and a drafter belong together in ``compat.py``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_trt.errors import CheckpointError, CompatibilityError
from dflash_trt.ingest import files, format_guards, formats
from dflash_trt.ingest.resolve import open_dir, read_json
from dflash_trt.model import DrafterConfig, drafter_for, family_of

if TYPE_CHECKING:  # torch is imported where weights are loaded, not to read a config
    import torch

    from dflash_trt.model import Drafter


def is_drafter(path: str | Path) -> bool:
    """Whether a directory's config.json describes a drafter (of any family) rather than a model."""
    cfg_path = Path(path) / "config.json"
    if not cfg_path.exists():
        return False
    cfg = read_json(cfg_path)
    archs = " ".join(str(a) for a in cfg.get("architectures") or []).lower()
    return bool(
        {"dflash_config", "dflash2_config", "speculators_config", "speculators_model_type"} & set(cfg)
        or "dflash" in archs
        or "dspark" in archs
    )


@dataclass
class DrafterSpec:
    """A drafter as read from disk (configs + safetensors headers; no tensor loaded)."""

    path: Path
    format: str
    config: DrafterConfig
    raw_config: dict
    norm: formats.Normalised
    weights: files.WeightSet
    warnings: list[str] = field(default_factory=list)

    @property
    def weights_present(self) -> bool:
        return self.weights.present

    @property
    def published_layer_ids(self) -> list[int]:
        return self.norm.published_layer_ids

    @property
    def defaulted(self) -> list[str]:
        return self.norm.defaulted

    def drafter_tensors(self) -> dict[str, files.TensorInfo]:
        """Header info under z-lab names (tensors that are not the drafter's left out)."""
        out = {}
        for name, info in self.weights.tensors.items():
            new = self.norm.rename(name)
            if new is not None:
                out[new] = info
        return out

    @property
    def num_parameters(self) -> int:
        if self.weights.present:
            return sum(t.numel for n, t in self.drafter_tensors().items() if n != "d2t")
        shapes = formats.expected_shapes(self.config)
        return sum(_numel(s) for n, s in shapes.items() if n != "d2t")

    @property
    def dtype(self) -> str:
        """The stored floating dtype (the config's when weights are absent)."""
        counts: dict[str, int] = {}
        for t in self.drafter_tensors().values():
            if t.dtype in files.FLOAT_DTYPES:
                counts[t.dtype] = counts.get(t.dtype, 0) + t.numel
        if not counts:
            return self.config.dtype
        return files.TORCH_NAMES[max(counts, key=lambda k: counts[k])]

    def to_dict(self) -> dict:
        c = self.config
        return {
            "path": str(self.path),
            "kind": "drafter",
            "format": self.format,
            "architecture": (self.raw_config.get("architectures") or ["?"])[0],
            "block_size": c.block_size,
            "mask_token_id": c.mask_token_id,
            "target_layer_ids": {
                "zlab": list(c.target_layer_ids),
                "output_hidden_states": [i + 1 for i in c.target_layer_ids],
                "published": self.published_layer_ids,
                "published_convention": self.norm.layer_convention,
            },
            "num_target_layers": c.num_target_layers,
            "layers": c.num_hidden_layers,
            "hidden_size": c.hidden_size,
            "heads": c.num_attention_heads,
            "kv_heads": c.num_key_value_heads,
            "head_dim": c.head_dim,
            "vocab_size": c.vocab_size,
            "draft_vocab_size": c.draft_vocab_size,
            "layer_types": c.layer_types,
            "sliding_window": c.sliding_window,
            "causal": c.causal,
            "rope_theta": c.rope_theta,
            "rope_scaling": c.rope_scaling,
            "num_parameters": self.num_parameters,
            "bytes_on_disk": self.weights.bytes_on_disk,
            "dtype": self.dtype,
            "weights_present": self.weights_present,
            "defaulted": self.defaulted,
            "notes": self.norm.notes,
            "warnings": self.warnings,
            "family": c.family,
            **family_of(c).describe(c),
        }


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def read_drafter(path: str | Path, require_weights: bool = True) -> DrafterSpec:
    """Read a drafter in any supported format from configs and safetensors headers.

    ``require_weights=False`` accepts a config-only directory (planning, ``--dry-run``).
    """
    format_guards.refuse_gguf(Path(path))  # before "no config.json / safetensors": name what it is
    path = open_dir(path, "DFlash drafter")
    raw = read_json(path / "config.json")
    ws = files.scan(path, require=require_weights, what="drafter")
    names = list(ws.tensors)
    norm = formats.normalise(raw, names, path)
    formats.check_quantized(ws.tensors, raw, path)
    try:
        config = DrafterConfig.from_zlab(norm.zlab)
    except (ValueError, KeyError, TypeError) as exc:
        first = str(exc).splitlines()
        detail = " ".join(first[:3]) if first else type(exc).__name__
        raise CheckpointError(f"{path / 'config.json'}: invalid drafter config: {detail}") from exc
    spec = DrafterSpec(path, norm.format, config, raw, norm, ws, warnings=list(ws.warnings))
    if norm.format == "jetspec":  # where it runs right, and where it is refused (format_guards)
        norm.notes.append(
            "JetSpec runs on dflash-trt's runtime (reference, ONNX / TensorRT graphs); "
            + (format_guards.trtllm_refusal(True) or "")
        )
    if norm.defaulted:
        spec.warnings.append(
            f"drafter config.json omits {', '.join(norm.defaulted)}; using the "
            f"{raw.get('model_type') or 'qwen3'} defaults"
        )
    if ws.present:
        _check_tensors(spec)
    return spec


def _check_tensors(spec: DrafterSpec) -> None:
    expected = formats.expected_shapes(spec.config)
    got = spec.drafter_tensors()
    where = spec.path
    if spec.config.draft_vocab_size and not {"lm_head.weight", "d2t"} <= set(got):
        raise CheckpointError(
            f"{where}: reduced draft vocabulary ({spec.config.draft_vocab_size}) but no "
            "lm_head.weight/d2t in the weights; the drafter's own head is missing (replacing "
            "it with the target's destroys acceptance): download the complete drafter"
        )
    missing = sorted(set(expected) - set(got))
    family_of(spec.config).check_tensors(missing, where)  # what the family adds, first: its absence says more
    if missing:
        raise CheckpointError(
            f"{where}: drafter weights lack {missing[0]} ({len(missing)} missing); "
            "incomplete download, or config.json does not describe these weights"
        )
    unexpected = sorted(set(got) - set(expected))
    if unexpected:
        raise CheckpointError(
            f"{where}: unexpected drafter tensor {unexpected[0]} ({len(unexpected)} in all) "
            f"for a {spec.format} drafter; config.json does not describe these weights"
        )
    for name, shape in expected.items():
        info = got[name]
        if info.shape != shape:
            c = spec.config
            raise CheckpointError(
                f"{where / info.file}: tensor {name} has shape {list(info.shape)}, config.json implies "
                f"{list(shape)} (hidden_size {c.hidden_size}, heads {c.num_attention_heads}x{c.head_dim}, "
                f"kv {c.num_key_value_heads}, {len(c.target_layer_ids)} target layers)"
            )
    if spec.config.draft_vocab_size and got["d2t"].dtype not in ("I64", "I32"):
        raise CheckpointError(f"{where}: d2t must hold integers, found {got['d2t'].dtype}")
    t2d = spec.weights.tensors.get(spec.norm.prefix + "t2d")
    if t2d is not None and t2d.shape != (spec.config.vocab_size,):
        raise CheckpointError(
            f"{where}: t2d has shape {list(t2d.shape)}, expected [{spec.config.vocab_size}] "
            "(one entry per target token)"
        )
    floats = {t.dtype for n, t in got.items() if n != "d2t"}
    if len(floats) > 1:
        spec.warnings.append(f"drafter weights mix dtypes {sorted(floats)}")
    stored = spec.dtype
    if spec.config.dtype and stored != spec.config.dtype:
        spec.warnings.append(f"drafter config says {spec.config.dtype}, weights are stored as {stored}")


def _absolute_d2t(d2t: torch.Tensor, t2d: torch.Tensor | None, spec: DrafterSpec) -> torch.Tensor:
    """Draft id -> absolute target id (speculators stores offsets; validated against t2d)."""
    import torch  # start-up: torch

    vocab = spec.config.vocab_size
    d2t = d2t.long()
    candidates = [d2t + torch.arange(len(d2t)), d2t] if spec.norm.d2t_offsets else [d2t]
    for absolute in candidates:
        ok = bool(((absolute >= 0) & (absolute < vocab)).all()) and len(set(absolute.tolist())) == len(absolute)
        if ok and t2d is not None:
            ok = torch.equal(torch.nonzero(t2d.bool()).flatten(), torch.sort(absolute).values)
        if ok:
            if spec.norm.d2t_offsets and absolute is d2t:
                spec.warnings.append("d2t holds absolute ids, not speculators offsets (checked against t2d)")
            return absolute
    raise CheckpointError(
        f"{spec.path}: d2t does not map the draft vocabulary into the target's "
        f"{vocab} ids consistently" + (" with t2d" if t2d is not None else "") + "; the vocabulary maps are corrupt"
    )


def load_state(spec: DrafterSpec) -> dict[str, torch.Tensor]:
    """The drafter's tensors under z-lab names, vocabulary map normalised (absolute d2t)."""
    from safetensors import safe_open  # start-up: safetensors

    state: dict[str, torch.Tensor] = {}
    t2d = None
    for f in spec.weights.files:
        try:
            with safe_open(str(f), framework="pt") as h:
                for name in h.keys():
                    new = spec.norm.rename(name)
                    if new is not None:
                        state[new] = h.get_tensor(name)
                    elif name == spec.norm.prefix + "t2d":
                        t2d = h.get_tensor(name)
        except (OSError, RuntimeError, ValueError) as exc:  # safetensors' own errors on corrupt data
            raise CheckpointError(f"{f}: cannot read tensors: {str(exc).splitlines()[0]}") from exc
    if spec.config.draft_vocab_size:
        state["d2t"] = _absolute_d2t(state["d2t"], t2d, spec)
    return state


def load_drafter(path: str | Path | DrafterSpec, dtype: torch.dtype | None = None) -> Drafter:
    """Load a drafter of any supported format (speculators, ModelOpt, z-lab) for the runtime;
    given its :class:`DrafterSpec` (read with weights), its configs and headers are not read again."""
    spec = path if isinstance(path, DrafterSpec) else read_drafter(path)
    return drafter_for(spec.config).from_state(spec.config, load_state(spec), dtype=dtype)


def write_zlab(drafter_dir: str | Path, out_dir: str | Path) -> Path:
    """Write the drafter in z-lab form (config.json + model.safetensors), atomically.

    Keeps the stored dtype. The result is what TensorRT-LLM's DFlash loader reads: no
    tensor prefix, ``fc``/``hidden_norm``, z-lab layer ids, block size at the top level.
    """
    spec = read_drafter(drafter_dir)
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"{out}: exists and is not empty; choose another output directory")
    drafter = drafter_for(spec.config).from_state(spec.config, load_state(spec), dtype=files.torch_dtype(spec.dtype))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        drafter.save(tmp)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def check_pair_runtime(target_model, drafter: Drafter, where: str = "drafter") -> None:
    """The checks without which the runtime would crash or silently draft garbage."""
    tcfg = target_model.config
    tcfg = tcfg.get_text_config() if hasattr(tcfg, "get_text_config") else tcfg
    d = drafter.cfg
    if d.hidden_size != tcfg.hidden_size:
        raise CompatibilityError(
            f"{where}: drafter hidden_size {d.hidden_size} != target hidden_size {tcfg.hidden_size}; "
            "this drafter was trained for another target"
        )
    depth = tcfg.num_hidden_layers
    bad = [i for i in d.target_layer_ids if not 0 <= i < depth]
    if bad:
        raise CompatibilityError(
            f"{where}: target_layer_ids {bad} out of range for a {depth}-layer target "
            "(z-lab ids count decoder layers from 0)"
        )
    vocab = target_model.get_input_embeddings().weight.shape[0]
    if d.mask_token_id >= vocab:
        raise CompatibilityError(
            f"{where}: mask_token_id {d.mask_token_id} has no row in the target's {vocab}-row embedding"
        )
