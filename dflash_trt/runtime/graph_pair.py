"""A bundle's pair for a graph backend: what the commands read from a pair, without the weights.

``--backend onnx | tensorrt`` runs the bundle's exported graphs; the PyTorch modules are never
called (``runtime.generate`` ignores them when a backend is given). :func:`load_graph_pair`
builds them on the meta device from their configs (nothing read or allocated), so configs,
shapes, parameter counts, the tokenizer, stop ids and the serving plan stay as
``pair.load_bundle`` gives them.
"""

from __future__ import annotations

import torch

from dflash_trt import ingest
from dflash_trt.model import Target, drafter_for
from dflash_trt.runtime.pair import Pair, load_tokenizer, serving_plan, stop_ids


def load_graph_pair(path):
    """A bundle's ``Pair`` for a graph backend (``--backend onnx | tensorrt``), which runs the bundle's
    graphs and never the PyTorch modules: tokenizer, stop ids and serving plan as ``load_bundle``
    gives them, the target and drafter built from their configs on the meta device (no weights
    read or allocated; their configs, shapes and parameter counts stay readable)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    bundle = ingest.open_bundle(path)
    ref = bundle.manifest.reference_runtime
    tdir, ddir = bundle.root / ref.target, bundle.root / ref.drafter
    ingest.validate_pair(tdir, ddir)                  # configs + safetensors headers only
    cfg = AutoConfig.from_pretrained(str(tdir), trust_remote_code=False)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    spec = ingest.read_drafter(ddir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, trust_remote_code=False).eval()
        drafter = drafter_for(spec.config)(spec.config).eval()
    if (tdir / "generation_config.json").exists():
        model.generation_config = GenerationConfig.from_pretrained(str(tdir))
    tokenizer = load_tokenizer(tdir)
    pair = Pair(Target(model, drafter.cfg.target_layer_ids), drafter, tokenizer, stop_ids(model, tokenizer),
                name=bundle.root.name)
    pair.max_batch_size, pair.draft_len_schedule = serving_plan(bundle.trtllm_config)
    return pair
