"""A loaded (target, drafter, tokenizer) ready for the reference runtime.

``load_pair`` is the one place the commands that run models (generate, bench, serve) get
their models from, whatever the user named: local directories, hub ids, a bundle
directory, or the embedded default. ``open_backend`` gives a bundle's pair the backend that
answers the loop's calls when it is not the PyTorch modules themselves (``--backend``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from dflash_trt import ingest
from dflash_trt.errors import CheckpointError, DFlashError
from dflash_trt.model import Drafter, Target, load_target
from dflash_trt.runtime.backend import Backend
from dflash_trt.runtime.loop import block_size_for

#: what ``--backend`` chooses: the PyTorch modules, ONNX Runtime over onnx/, TensorRT over engines/
BACKENDS = ("torch", "onnx", "tensorrt")

# The dtypes the reference runtime computes in (``ingest.RUNTIME_DTYPES``, the one dtype table's).
DTYPES = {name: ingest.torch_dtype(name) for name in ingest.RUNTIME_DTYPES}


@dataclass
class Pair:
    """Models and tokenizer; from a bundle also its serving plan: ``max_batch_size`` and the
    ``draft_len_schedule`` ({batch size: draft length}, TensorRT-LLM's lookup) of its
    ``trtllm/config.yaml`` (None: not planned)."""

    target: Target
    drafter: Drafter | None
    tokenizer: object
    stop_token_ids: list[int] = field(default_factory=list)
    name: str = "model"
    #: what answers the loop's model calls (``generate(..., backend=)``); None: the modules above
    backend: Backend | None = None
    max_batch_size: int | None = None
    draft_len_schedule: dict[int, int] | None = None

    def encode(self, text: str, chat: bool = False) -> list[int]:
        tok = self.tokenizer
        if chat:
            if not getattr(tok, "chat_template", None):
                raise DFlashError(f"{self.name}: the tokenizer has no chat template; drop --chat")
            ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                          tokenize=True)
            return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        return tok(text, add_special_tokens=True)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def block_size(self, requested: int | None = None) -> int:
        """The draft block size to run on this pair (:func:`block_size_for`)."""
        return block_size_for(requested, self.drafter.cfg.block_size if self.drafter is not None else None)


def parse_dtype(name: str, device: str = "cpu") -> torch.dtype:
    if name == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    if name not in DTYPES:
        raise DFlashError(f"unknown dtype {name!r}; choose auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    if not ingest.tokenizer_files(path):
        raise CheckpointError(f"{path}: no tokenizer files (tokenizer.json / tokenizer_config.json)")
    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"{path}: cannot load tokenizer: {str(exc).splitlines()[0]}") from exc


def stop_ids(model, tokenizer) -> list[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        if eos is not None:
            ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


def load_pair(target: str | Path, drafter: str | Path | None, *, dtype: str = "auto",
              device: str = "cpu") -> Pair:
    """Load a target and (optionally) a drafter in any supported format, validated as a pair first."""
    tdir = ingest.resolve(str(target), role="target")
    ddir = ingest.resolve(str(drafter), role="drafter") if drafter is not None else None
    # Configs + safetensors headers only: a mismatched or corrupt pair fails here, before any load.
    if ddir is not None:
        ingest.validate_pair(tdir, ddir)
    else:
        ingest.read_target(tdir)
    torch_dtype = parse_dtype(dtype, device)
    model = load_target(tdir, dtype=torch_dtype, device=device)
    tokenizer = load_tokenizer(tdir)
    d = None
    if ddir is not None:
        d = ingest.load_drafter(ddir, dtype=torch_dtype).to(device)
        ingest.check_pair_runtime(model, d, where=str(ddir))
    layer_ids = d.cfg.target_layer_ids if d is not None else None
    return Pair(Target(model, layer_ids), d, tokenizer, stop_ids(model, tokenizer), name=tdir.name)


def load_bundle(path: str | Path, *, dtype: str = "auto", device: str = "cpu") -> Pair:
    """Load a ``dflash-trt build`` bundle for the reference runtime.

    BF16 and as-shipped bundles load their ``target/`` directly. A bundle ModelOpt
    quantized (fp8 / nvfp4) is dequantized on load (``quantize.dequantize_state``): the
    reference runtime then runs the quantized weights in the runtime dtype (weight-only;
    activations are not quantized), so acceptance reflects the quantized target. The
    manifest also records the unquantized source (``reference_runtime.source_target``).
    """
    bundle = ingest.open_bundle(path)
    ref = bundle.manifest.reference_runtime
    tdir, ddir = bundle.root / ref.target, bundle.root / ref.drafter
    if not ref.dequantize:
        pair = load_pair(tdir, ddir, dtype=dtype, device=device)
    else:
        torch_dtype = parse_dtype(dtype, device)
        model = _load_dequantized(tdir, torch_dtype, device)
        tokenizer = load_tokenizer(tdir)
        d = ingest.load_drafter(ddir, dtype=torch_dtype).to(device)
        ingest.check_pair_runtime(model, d, where=str(ddir))
        pair = Pair(Target(model, d.cfg.target_layer_ids), d, tokenizer, stop_ids(model, tokenizer))
    pair.name = bundle.root.name
    pair.max_batch_size, pair.draft_len_schedule = serving_plan(bundle.trtllm_config)
    return pair


def serving_plan(config_yaml: Path) -> tuple[int | None, dict[int, int] | None]:
    """(max_batch_size, draft_len_schedule) from a TensorRT-LLM config; (None, None) without one.

    ``speculative_config.max_concurrency: N`` is the schedule ``{N: max_draft_len}``, as
    TensorRT-LLM translates it; ``draft_len_schedule`` is read as written (keys: batch sizes).
    """
    import yaml

    if not config_yaml.is_file():
        return None, None
    try:
        cfg = yaml.safe_load(config_yaml.read_text()) or {}
        spec = cfg.get("speculative_config") or {}
        batch = int(cfg["max_batch_size"]) if cfg.get("max_batch_size") else None
        if spec.get("draft_len_schedule"):
            return batch, {int(k): int(v) for k, v in spec["draft_len_schedule"].items()}
        if spec.get("max_concurrency"):
            return batch, {int(spec["max_concurrency"]): int(spec["max_draft_len"])}
        return batch, None
    except (yaml.YAMLError, AttributeError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{config_yaml}: cannot read the serving plan: {exc}") from None


def _load_dequantized(tdir: Path, dtype: torch.dtype, device: str):
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from dflash_trt.runtime.dequantize import dequantize_state

    cfg = AutoConfig.from_pretrained(str(tdir), trust_remote_code=False)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, trust_remote_code=False)
    state = dequantize_state(tdir, dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(cfg, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise CheckpointError(f"{tdir}: dequantized tensors do not match the config: missing "
                              f"{sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]}")
    if tied:
        model.tie_weights()
    if (tdir / "generation_config.json").exists():
        model.generation_config = GenerationConfig.from_pretrained(str(tdir))
    return model.to(device).eval()


def open_backend(kind: str, bundle: str | Path, pair: Pair, dtype: str = "auto") -> Backend | None:
    """The backend ``--backend kind`` names for a loaded bundle (None for ``torch``: the pair's
    own modules). ``onnx`` and ``tensorrt`` run the graphs of a bundle built with ``--engine
    tensorrt`` at the shapes its manifest records; anything missing is one DFlashError line."""
    if kind not in BACKENDS:
        raise DFlashError(f"--backend {kind!r}: choose one of {', '.join(BACKENDS)}")
    if kind == "torch":
        return None
    b = ingest.open_bundle(bundle)
    engine = b.manifest.engine
    if engine is None:
        raise DFlashError(f"{b.root}: --backend {kind} runs the exported graphs of a bundle built with "
                          "--engine tensorrt; this one has none (rebuild it so, or use --backend torch)")
    if engine.profile is None or not (b.onnx / "embed.onnx").is_file():
        raise DFlashError(f"{b.root}: its onnx/ predates the recorded engine profile; "
                          "rebuild it with --engine tensorrt")
    if dtype not in ("auto", "float32"):
        raise DFlashError(f"--backend {kind} runs the float32 graphs the build exported; drop --dtype {dtype}")
    mask = pair.drafter.cfg.mask_token_id
    if kind == "onnx":
        from dflash_trt.runtime.onnx_backend import OnnxBackend

        return OnnxBackend(b.onnx, engine.profile, mask)
    from dflash_trt.runtime.trt_backend import TensorRTBackend, tensorrt_problem

    if tensorrt_problem() is None and not engine.engines_built:
        raise DFlashError(f"{b.root}: no engines/ in this bundle (the build said: {engine.engines_reason}); "
                          "rebuild it where TensorRT and a GPU are, or use --backend onnx")
    return TensorRTBackend(b.engines, engine.profile, mask)
