"""The target side of the standalone path as ONNX: the target forward (``target.onnx``) and the
token embedding (``embed.onnx``), with the target's onnxruntime parity check.

Invariant: each graph's inputs, outputs and dynamic axes are ``graph_io``'s (``TARGET_INPUTS``,
``TARGET_OUTPUTS``, ``DYNAMIC_AXES["target"]`` / ``["embed"]``), and a target this module cannot
export is refused as one ``DFlashError`` line before its graph is written.

Target graph (``target.onnx``): a transformers causal LM with the DFlash target_hidden
(``output_hidden_states[i + 1]`` for each layer id, concatenated) as an extra output and
its KV cache as stacked tensors:

    inputs : input_ids [b, T], attention_mask [b, P+T], position_ids [b, T],
             past_k, past_v [layers, b, kvh, P, head_dim]   (P may be 0)
    outputs: logits [b, T, V], target_hidden [b, T, n_tap*H], new_k, new_v [layers, b, kvh, T, hd]

The graph returns only this forward's K/V (``new_k``/``new_v``, with their RoPE): the runtime owns
the cache as a buffer it writes them into (``runtime.graph_backend.DenseTargetCache``: only the
columns the verify accepted, so the cache stays packed by row and never goes through the graph's
outputs whole). The past is read as-is; the mask says which of its P columns are valid.

Only targets whose every layer keeps a plain full-attention K/V cache of one shape export
this way (:func:`target_export_problem` says why another does not).

Embedding graph (``embed.onnx``): input_ids [b, T] -> embeds [b, T, H], the target's embedding
rows times the drafter's ``input_embedding_scale``: the drafter block's input.
"""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.export import Dim

from dflash_trt.errors import DFlashError, require
from dflash_trt.export.graph_io import DYNAMIC_AXES, TARGET_INPUTS, TARGET_OUTPUTS


def target_export_problem(config) -> str | None:
    """Why a target's graph cannot carry its cache as two stacked tensors (None: it can).

    ``target.onnx`` stacks every layer's K and V into ``past_k`` / ``past_v`` [layers, b, kvh, P, d]:
    that needs one plain full-attention cache per layer, all of one shape. transformers builds a
    sliding-window layer (kept to the window) or a linear-attention layer (a recurrent and a conv
    state, which a rejected draft token must not enter) for other layer types."""
    from transformers import DynamicCache  # start-up: transformers (the export package loads without it)

    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    kinds = sorted({type(layer).__name__ for layer in DynamicCache(config=config).layers} - {"DynamicLayer"})
    if kinds:
        what = (
            "recurrent/conv state (hybrid)"
            if any("Linear" in k or "Mamba" in k for k in kinds)
            else "sparse-attention indexer key"
            if any("Indexed" in k for k in kinds)
            else "compressor state (DeepSeek V4)"
            if any(k.endswith(("HCACache", "CSACache")) for k in kinds)
            else "sliding-window"
        )
        return f"its cache has {what} layers ({', '.join(kinds)}), which the stacked past_k/past_v cannot carry"
    if getattr(cfg, "kv_lora_rank", None):
        return "its attention is MLA (compressed K/V of a different width than V), which past_k/past_v do not carry"
    head_dims = {getattr(cfg, n) for n in ("head_dim", "v_head_dim") if getattr(cfg, n, None)}
    if len(head_dims) > 1:
        return f"its K and V head sizes differ ({sorted(head_dims)})"
    return None


class TargetWithTaps(nn.Module):
    """A causal LM forward with the stacked KV cache in, this forward's K/V out, plus the DFlash target_hidden."""

    def __init__(self, model: nn.Module, layer_ids: list[int]):
        super().__init__()
        self.model = model.eval()
        self.layer_ids = list(layer_ids)
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.num_layers = int(cfg.num_hidden_layers)
        # transformers 5.x renamed past_key_values to cache (as model.Target does)
        self._cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def forward(self, input_ids, attention_mask, position_ids, past_k, past_v):
        from transformers import DynamicCache  # start-up: transformers (the export package loads without it)

        cache = DynamicCache(config=self.model.config)
        for i in range(self.num_layers):
            cache.update(past_k[i], past_v[i], i)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            output_hidden_states=True,
            **{self._cache_kw: cache},
        )
        target_hidden = torch.cat([out.hidden_states[i + 1] for i in self.layer_ids], dim=-1)
        layers, P = cache.layers, past_k.shape[3]
        return (
            out.logits,
            target_hidden,
            torch.stack([layers[i].keys[:, :, P:] for i in range(self.num_layers)]),
            torch.stack([layers[i].values[:, :, P:] for i in range(self.num_layers)]),
        )  # [L, b, kvh, T, d]


def target_example_inputs(model: nn.Module, batch: int = 2, past: int = 5, T: int = 3, seed: int = 0) -> dict:
    """Random inputs with holes in the cached columns (rejected drafts and padding, as the loop
    leaves them): the exported mask path must not assume a dense cache."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    gen = torch.Generator().manual_seed(seed)
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kvh = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    L = int(cfg.num_hidden_layers)
    dtype = model.get_input_embeddings().weight.dtype
    mask = torch.ones(batch, past + T, dtype=torch.long)
    if past > 1:
        mask[0, 1] = 0
        mask[batch - 1, past - 1] = 0
    return dict(
        input_ids=torch.randint(0, cfg.vocab_size, (batch, T), generator=gen),
        attention_mask=mask,
        position_ids=torch.arange(past, past + T)[None].expand(batch, -1).contiguous(),
        past_k=torch.randn(L, batch, kvh, past, hd, generator=gen).to(dtype),
        past_v=torch.randn(L, batch, kvh, past, hd, generator=gen).to(dtype),
    )


def export_target_onnx(hf_model: nn.Module, layer_ids: list[int], out_dir, *, filename: str = "target.onnx") -> Path:
    """Export a transformers causal LM with target_hidden and KV-cache I/O. A target whose cache
    does not stack (:func:`target_export_problem`) or that does not trace is one DFlashError line."""
    onnx = require("onnx", "onnx", "ONNX export")
    require("onnxscript", "onnx", "ONNX export")
    kind = getattr(hf_model.config, "model_type", "?")
    problem = target_export_problem(hf_model.config)
    if problem:
        raise DFlashError(f"target {kind} does not export to target.onnx: {problem}; build it without --graphs")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    module = TargetWithTaps(hf_model, layer_ids)
    inputs = target_example_inputs(hf_model)
    D = Dim.DYNAMIC  # torch.export infers the relations (P + T, one batch); DYNAMIC_AXES names them
    dyn = {name: {axis: D for axis in axes} for name, axes in DYNAMIC_AXES["target"].items()}
    path = out / filename
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            prog = torch.onnx.export(
                module,
                tuple(inputs[n] for n in TARGET_INPUTS),
                dynamo=True,
                dynamic_shapes=dyn,
                input_names=TARGET_INPUTS,
                output_names=TARGET_OUTPUTS,
                verbose=False,
            )
    except Exception as exc:  # noqa: BLE001 - torch.export's errors are pages long; one line says which
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise DFlashError(
            f"target {kind} does not export to target.onnx ({type(exc).__name__}: {first}); build it without --graphs"
        ) from None
    onnx.checker.check_model(prog.model_proto)
    prog.save(str(path))
    return path


def check_target_onnx(hf_model: nn.Module, layer_ids: list[int], onnx_path, **shape) -> dict:
    """onnxruntime vs the transformers forward, on a cache with holes; max abs error per output."""
    import onnxruntime as ort  # optional: onnx

    inputs = target_example_inputs(hf_model, **shape)
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {k: v.numpy() for k, v in inputs.items()})
    with torch.no_grad():
        want = TargetWithTaps(hf_model, layer_ids)(*(inputs[n] for n in TARGET_INPUTS))
    return {n: float(np.abs(g - w.numpy()).max()) for n, g, w in zip(TARGET_OUTPUTS, got, want, strict=True)}


def export_embed_onnx(weight: torch.Tensor, scale: float, out_dir, *, filename: str = "embed.onnx") -> Path:
    """``embeds = weight[input_ids] * scale`` as a two-node graph (Gather, Mul): the drafter
    block's embedding (``model.Target.embed``) without the target's torch module."""
    onnx = require("onnx", "onnx", "ONNX export")
    from onnx import TensorProto, helper, numpy_helper  # optional: onnx

    w = weight.detach().float().cpu().numpy()
    nodes = [
        helper.make_node("Gather", ["weight", "input_ids"], ["rows"], axis=0),
        helper.make_node("Mul", ["rows", "scale"], ["embeds"]),
    ]
    graph = helper.make_graph(
        nodes,
        "dflash_embed",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"])],
        [helper.make_tensor_value_info("embeds", TensorProto.FLOAT, ["batch", "tokens", w.shape[1]])],
        initializer=[
            numpy_helper.from_array(w, "weight"),
            numpy_helper.from_array(np.array(scale, dtype=np.float32), "scale"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / filename
    onnx.save(model, str(path))
    return path
