"""A loaded (target, drafter, tokenizer) with what runs it: a finished :class:`Pair`.

``load_pair`` and ``load_bundle`` are the one place the commands that run models (generate,
bench, serve) get their models from, whatever the user named: local directories, hub ids, a
bundle directory, or the embedded default. Each takes the resolved
:class:`~dflash_trt.runtime.spec.RunSpec` and returns the pair complete, its backend open
(``--backend``); nothing sets a field of a pair after loading (it is frozen).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from dflash_trt import ingest
from dflash_trt.errors import CheckpointError, DFlashError
from dflash_trt.model import Drafter, Target, drafter_for, load_target
from dflash_trt.runtime.backend import Backend, TorchBackend
from dflash_trt.runtime.dequantize import dequantize_state
from dflash_trt.runtime.loop import block_size_for
from dflash_trt.runtime.onnx_backend import OnnxBackend
from dflash_trt.runtime.spec import DISPATCH, RunSpec
from dflash_trt.runtime.trt_backend import TensorRTBackend

# The dtypes the reference runtime computes in (``ingest.RUNTIME_DTYPES``, the one dtype table's).
DTYPES = {name: ingest.torch_dtype(name) for name in ingest.RUNTIME_DTYPES}


@dataclass(frozen=True)
class Pair:
    """Models and tokenizer, the :class:`RunSpec` they run under and the backend that answers the
    loop's model calls (built from the modules, ``TorchBackend``, when not given); from a bundle
    also its serving plan: ``max_batch_size`` and the ``draft_len_schedule`` ({batch size: draft
    length}, TensorRT-LLM's lookup) of its ``trtllm/config.yaml`` (None: not planned).
    A changed pair is a new one (``dataclasses.replace``)."""

    target: Target
    drafter: Drafter | None
    tokenizer: Any  # a transformers tokenizer (PreTrainedTokenizerBase)
    stop_token_ids: list[int] = field(default_factory=list)
    name: str = "model"
    #: what answers the loop's model calls (``generate(..., backend=pair.backend)``); always set
    backend: Backend = None  # type: ignore[assignment]  # None on construction: TorchBackend(target, drafter)
    spec: RunSpec = RunSpec()
    max_batch_size: int | None = None
    draft_len_schedule: dict[int, int] | None = None

    def __post_init__(self) -> None:
        if self.backend is None:
            if self.spec.graphs:
                raise DFlashError(
                    f"a pair run by the {self.spec.backend} backend needs that backend opened: load it with load_bundle"
                )
            object.__setattr__(self, "backend", TorchBackend(self.target, self.drafter))
        if self.drafter is not None:  # the torch backend's dflash ops (``plugins.dispatch``)
            self.drafter.kernels = DISPATCH[self.spec.kernels]

    def encode(self, text: str, chat: bool = False) -> list[int]:
        tok = self.tokenizer
        if chat:
            if not getattr(tok, "chat_template", None):
                raise DFlashError(f"{self.name}: the tokenizer has no chat template; drop --chat")
            ids = tok.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
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
    from transformers import AutoTokenizer  # start-up: transformers (importing the runtime does not import it)

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


def load_pair(
    target: str | Path,
    drafter: str | Path | None,
    spec: RunSpec | None = None,
    *,
    dtype: str = "auto",
    device: str = "cpu",
) -> Pair:
    """Load a target and (optionally) a drafter in any supported format, validated as a pair first,
    to run under ``spec`` (default: the torch backend, lean kernels); the graph backends
    run a bundle's graphs (:func:`load_bundle`)."""
    spec = spec or RunSpec()
    if spec.graphs:
        raise DFlashError(
            f"--backend {spec.backend} runs a bundle's exported graphs: pass a bundle built with --graphs"
        )
    tdir = ingest.resolve(str(target), role="target")
    ddir = ingest.resolve(str(drafter), role="drafter") if drafter is not None else None
    # Configs + safetensors headers only, read once: a mismatched or corrupt pair fails here, before any load.
    read = ingest.read_pair(tdir, ddir) if ddir is not None else None
    if read is None:
        ingest.read_target(tdir)
    torch_dtype = parse_dtype(dtype, device)
    model = load_target(tdir, dtype=torch_dtype, device=device)
    tokenizer = load_tokenizer(tdir)
    d = None
    if ddir is not None and read is not None:
        d = ingest.load_drafter(read.drafter, dtype=torch_dtype).to(device)
        ingest.check_pair_runtime(model, d, where=str(ddir))
    layer_ids = d.cfg.target_layer_ids if d is not None else None
    return Pair(Target(model, layer_ids), d, tokenizer, stop_ids(model, tokenizer), name=tdir.name, spec=spec)


def load_bundle(path: str | Path, spec: RunSpec | None = None, *, dtype: str = "auto", device: str = "cpu") -> Pair:
    """Load a ``dflash-trt build`` bundle to run under ``spec`` (default: the torch backend;
    resolve a graph backend's with ``resolve_run(..., bundle=path)``), its backend open.

    BF16 and as-shipped bundles load their ``target/`` directly. A bundle ModelOpt
    quantized (fp8 / nvfp4) is dequantized on load (``quantize.dequantize_state``): the
    reference runtime then runs the quantized weights in the runtime dtype (weight-only;
    activations are not quantized), so acceptance reflects the quantized target. The
    manifest also records the unquantized source (``reference_runtime.source_target``).
    A graph backend (``spec.graphs``) runs the bundle's graphs and never the PyTorch modules:
    they are built from their configs on the meta device (:func:`_graph_shell`: nothing read or
    allocated), so configs, shapes, tokenizer, stop ids and the serving plan stay as here.
    """
    spec = spec or RunSpec()
    bundle = ingest.open_bundle(path)
    ref = bundle.built.reference_runtime
    loaded = [ref.target, ref.drafter] + ([ingest.Layout.ONNX, ingest.Layout.ENGINES] if spec.graphs else [])
    try:
        # every file read is hashed beside the load and refused if it is not as built
        with ingest.LoadCheck(bundle, loaded, [ingest.Layout.TRTLLM_CONFIG]):
            return _load_bundle(bundle, spec, dtype, device)
    except CheckpointError as exc:  # a damaged bundle: its advice is to rebuild, not to download
        raise bundle_damage(exc, bundle.root) from exc


#: the advice a checkpoint reader gives for a damaged file, and what it means inside a bundle
_REDOWNLOAD = ("download the checkpoint again", "download it again", "download again")


def bundle_damage(exc: CheckpointError, root: Path) -> CheckpointError:
    """``exc`` said of a bundle: a damaged file is rebuilt with ``dflash-trt build``, not downloaded."""
    msg = str(exc)
    for phrase in _REDOWNLOAD:
        if phrase in msg:
            return CheckpointError(
                msg.replace(phrase, f"the bundle is damaged: rebuild it ('dflash-trt build ... -o {root} --force')")
            )
    return exc


def _load_bundle(bundle, spec: RunSpec, dtype: str, device: str) -> Pair:
    ref = bundle.built.reference_runtime
    tdir, ddir = bundle.root / ref.target, bundle.root / ref.drafter
    if spec.graphs:
        model, d = _graph_shell(tdir, ddir)
    else:
        torch_dtype = parse_dtype(dtype, device)
        drafter: Path | ingest.DrafterSpec = ddir
        if not ref.dequantize:
            drafter = ingest.read_pair(tdir, ddir).drafter
            model = load_target(tdir, dtype=torch_dtype, device=device)
        else:
            model = _load_dequantized(tdir, torch_dtype, device)
        d = ingest.load_drafter(drafter, dtype=torch_dtype).to(device)
        ingest.check_pair_runtime(model, d, where=str(ddir))
    tokenizer = load_tokenizer(tdir)
    max_batch_size, schedule = serving_plan(bundle.trtllm_config)
    graph = _graph_backend(spec, bundle, d)  # None: the pair's modules answer (TorchBackend)
    return Pair(
        Target(model, d.cfg.target_layer_ids),
        d,
        tokenizer,
        stop_ids(model, tokenizer),
        name=bundle.root.name,
        spec=spec,
        max_batch_size=max_batch_size,
        draft_len_schedule=schedule,
        **({"backend": graph} if graph is not None else {}),
    )


def _graph_shell(tdir: Path, ddir: Path):
    """(target, drafter) built from their configs on the meta device, for a pair whose backend runs
    the exported graphs: configs, shapes and parameter counts readable, no weight read or allocated."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig  # start-up: transformers

    spec = ingest.read_pair(tdir, ddir).drafter  # configs + safetensors headers only
    cfg = AutoConfig.from_pretrained(str(tdir), trust_remote_code=False)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, trust_remote_code=False).eval()
        drafter = drafter_for(spec.config)(spec.config).eval()
    if (tdir / "generation_config.json").exists():
        model.generation_config = GenerationConfig.from_pretrained(str(tdir))
    return model, drafter


def serving_plan(config_yaml: Path) -> tuple[int | None, dict[int, int] | None]:
    """(max_batch_size, draft_len_schedule) from a TensorRT-LLM config; (None, None) without one.

    ``speculative_config.max_concurrency: N`` is the schedule ``{N: max_draft_len}``, as
    TensorRT-LLM translates it; ``draft_len_schedule`` is read as written (keys: batch sizes).
    """
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
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig  # start-up: transformers

    cfg = AutoConfig.from_pretrained(str(tdir), trust_remote_code=False)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, trust_remote_code=False)
    state = dequantize_state(tdir, dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(cfg, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise CheckpointError(
            f"{tdir}: dequantized tensors do not match the config: missing "
            f"{sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]}"
        )
    if tied:
        model.tie_weights()
    if (tdir / "generation_config.json").exists():
        model.generation_config = GenerationConfig.from_pretrained(str(tdir))
    return model.to(device).eval()


def _graph_backend(spec: RunSpec, bundle, drafter: Drafter) -> Backend | None:
    """The backend ``spec`` names over ``bundle``'s graphs (None for torch: the pair's modules).
    :func:`~dflash_trt.runtime.spec.resolve_run` has checked the bundle has them."""
    if not spec.graphs:
        return None
    graphs = bundle.manifest.graphs
    if graphs is None or graphs.profile is None:
        raise DFlashError(
            f"{bundle.root}: --backend {spec.backend} needs a bundle built with --graphs "
            "(resolve the run spec with resolve_run first)"
        )
    mask = drafter.cfg.mask_token_id
    if spec.backend == "onnx":
        return OnnxBackend(bundle.onnx, graphs.profile, mask)
    return TensorRTBackend(bundle.engines, graphs.profile, mask)
