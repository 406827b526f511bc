"""ONNX export of the three graphs the standalone path runs (the drafter round with the two
DFlash custom ops, the target with its KV cache as I/O, the token embedding), their
onnxruntime parity checks, and the shapes they are run at (optional imports throughout;
TensorRT engines are built from them in ``engines.py``).

Drafter graph (``drafter.onnx``): one speculative round of the drafter, exactly
``Drafter.inject(target_hidden, n_new, cache)`` followed by ``Drafter.draft(block_embeds, cache)``:

    inputs : target_hidden [b, T, n_tap*H], n_new [b] int64, block_embeds [b, B, H],
             k_cache, v_cache [L, pages, page_size, kvh, d], page_table [b, max_pages] int32
             (already covering lengths + n_new: the runtime allocates pages),
             lengths [b] int64 (committed context length *before* this round's tokens)
    outputs: hidden [b, B, H] (final-normed block hidden states) or logits [b, B, V] when a
             head weight is given, k_cache_out, v_cache_out (the updated caches; TensorRT
             aliases them to the inputs, so the update is in place there)

fc -> hidden_norm -> the one fused K/V GEMM are plain ONNX nodes; ``dflash::KVInjection``
does k_norm + RoPE + paged scatter for all layers; every layer's attention is one
``dflash::BlockDiffusionAttention`` node reading the whole cache tensors (``layer``
attribute, no per-layer copies). Dims b, T, pages and max_pages are dynamic; B and
page_size are fixed at export (custom-op attributes).

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

:data:`DYNAMIC_AXES` names every dynamic axis by the profile dimension it is
(``ingest.EngineProfile``): the TensorRT optimisation profile and the runtimes' checks read it.
"""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dflash_trt import plugins
from dflash_trt.errors import DFlashError, require

DRAFTER_INPUTS = ["target_hidden", "n_new", "block_embeds", "k_cache", "v_cache", "page_table", "lengths"]
TARGET_INPUTS = ["input_ids", "attention_mask", "position_ids", "past_k", "past_v"]
TARGET_OUTPUTS = ["logits", "target_hidden", "new_k", "new_v"]
#: the graphs of a bundle's ``onnx/``, by role
GRAPHS = {"drafter": "drafter.onnx", "target": "target.onnx", "embed": "embed.onnx"}

#: Every dynamic axis of every graph, named by the ``ingest.EngineProfile`` dimension it is
#: bounded by: batch, tokens (per row in one call), seq (cached + new columns), past (cached
#: columns, 0 at prefill), pages (the drafter's pool), pages_per_seq (its page table's width).
DYNAMIC_AXES = {
    "drafter": {
        "target_hidden": {0: "batch", 1: "tokens"},
        "n_new": {0: "batch"},
        "block_embeds": {0: "batch"},
        "k_cache": {1: "pages"},
        "v_cache": {1: "pages"},
        "page_table": {0: "batch", 1: "pages_per_seq"},
        "lengths": {0: "batch"},
    },
    "target": {
        "input_ids": {0: "batch", 1: "tokens"},
        "attention_mask": {0: "batch", 1: "seq"},
        "position_ids": {0: "batch", 1: "tokens"},
        "past_k": {1: "batch", 3: "past"},
        "past_v": {1: "batch", 3: "past"},
    },
    "embed": {"input_ids": {0: "batch", 1: "tokens"}},
}

#: Drafter cache slots per page in the exported graphs (a custom-op attribute; 16 as ``PagedKVCache``).
PAGE_SIZE = 16

#: fp32 parity bounds the export is held to (ONNX Runtime vs ``Drafter.inject`` + ``draft``; vs
#: the transformers forward, whose logits are larger).
DRAFTER_ONNX_ATOL = 1e-4
TARGET_ONNX_ATOL = 1e-3


class DrafterRound(nn.Module):
    """``Drafter.inject`` + ``Drafter.draft`` as one traceable forward over the custom ops."""

    def __init__(self, drafter, head_weight: torch.Tensor | None = None, kernels: str = "reference"):
        super().__init__()
        from dflash_trt.plugins import torch_ops  # noqa: F401  (registers torch.ops.dflash)

        self.drafter = drafter
        self.kernels = kernels
        wkv, bkv, k_norm = plugins.fused_kv_weights(drafter)
        self.register_buffer("kv_weight", wkv.detach().clone(), persistent=False)
        self.register_buffer("kv_bias", None if bkv is None else bkv.detach().clone(), persistent=False)
        self.register_buffer("k_norm_weight", k_norm.detach().clone(), persistent=False)
        self.head = None
        if head_weight is not None:
            self.head = nn.Linear(head_weight.shape[1], head_weight.shape[0], bias=False)
            self.head.weight = nn.Parameter(head_weight.detach().clone(), requires_grad=False)

    def forward(self, target_hidden, n_new, block_embeds, k_cache, v_cache, page_table, lengths):
        from dflash_trt.plugins import fused_kv

        d = self.drafter
        cfg = d.cfg
        kv = fused_kv(target_hidden, d.fc.weight, d.hidden_norm.weight, self.kv_weight, self.kv_bias, cfg.rms_norm_eps)
        k_cache, v_cache = torch.ops.dflash.kv_cache_update(
            kv,
            self.k_norm_weight,
            d.inv_freq,
            n_new,
            lengths,
            page_table,
            k_cache,
            v_cache,
            float(d.rope_scaling_factor),
            float(cfg.rms_norm_eps),
            cfg.num_key_value_heads,
            cfg.head_dim,
            self.kernels,
        )
        ctx_len = lengths + n_new

        def attend(i, q, k, v):
            return torch.ops.dflash.block_attention(
                q,
                k,
                v,
                k_cache,
                v_cache,
                page_table,
                ctx_len,
                cfg.layer_causal(i),
                cfg.layer_window(i),
                cfg.head_dim**-0.5,
                i,
                self.kernels,
            )

        positions = ctx_len[:, None] + torch.arange(block_embeds.shape[1], device=block_embeds.device)
        out = d.block_forward(block_embeds, positions, attend)
        if self.head is not None:
            out = d.logits(out, self.head)
        return out, k_cache, v_cache


def example_round(drafter, batch: int = 2, T: int = 5, page_size: int = 4, seed: int = 0, prior: int = 7):
    """Inputs for one round on a cache that already holds some context (random, never zeros)."""
    cfg = drafter.cfg
    gen = torch.Generator().manual_seed(seed)
    dtype = drafter.fc.weight.dtype
    H, n_tap = cfg.hidden_size, len(cfg.target_layer_ids)
    cache = drafter.new_cache(batch, page_size=page_size)
    with torch.no_grad():
        first = torch.randn(batch, prior, n_tap * H, generator=gen).to(dtype)
        drafter.inject(first, torch.tensor([prior - i % prior for i in range(batch)]), cache)
    n_new = torch.tensor([T - (i % T) for i in range(batch)])
    cache.reserve(n_new)
    inputs = dict(
        target_hidden=torch.randn(batch, T, n_tap * H, generator=gen).to(dtype),
        n_new=n_new,
        block_embeds=torch.randn(batch, cfg.block_size, H, generator=gen).to(dtype),
        k_cache=cache.k.clone(),
        v_cache=cache.v.clone(),
        page_table=cache.page_table.clone(),
        lengths=cache.lengths.clone(),
    )
    return inputs, cache


def export_drafter_onnx(
    drafter,
    out_dir,
    *,
    head_weight: torch.Tensor | None = None,
    page_size: int = 4,
    dynamic: bool = True,
    filename: str = "drafter.onnx",
) -> Path:
    """Export one drafter round with ``dflash::KVInjection`` / ``dflash::BlockDiffusionAttention``;
    checked with ``onnx.checker`` (op schemas registered). Returns the .onnx path."""
    onnx = require("onnx", "onnx", "ONNX export")
    require("onnxscript", "onnx", "ONNX export")
    from torch.export import Dim

    from dflash_trt.plugins import onnx_ops

    cfg = drafter.cfg
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    module = DrafterRound(drafter, head_weight=head_weight).eval()
    inputs, _ = example_round(drafter, page_size=page_size)
    table = onnx_ops.translation_table(
        num_layers=cfg.num_hidden_layers,
        num_heads=cfg.num_attention_heads,
        num_kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        block_size=cfg.block_size,
        page_size=page_size,
        rope_theta=cfg.rope_theta,
    )
    dyn = None
    if dynamic:
        dims = {n: Dim(n) for n in ("batch", "tokens", "pages", "pages_per_seq")}
        dyn = {name: {axis: dims[d] for axis, d in axes.items()} for name, axes in DYNAMIC_AXES["drafter"].items()}
    path = out / filename
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(
            module,
            tuple(inputs[n] for n in DRAFTER_INPUTS),
            dynamo=True,
            dynamic_shapes=dyn,
            custom_translation_table=table,
            input_names=DRAFTER_INPUTS,
            output_names=["logits" if head_weight is not None else "hidden", "k_cache_out", "v_cache_out"],
            optimize=True,
            verbose=False,
        )
    model = prog.model_proto
    onnx_ops.register_onnx_schemas()
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def run_drafter_onnx(onnx_path, inputs: dict) -> list:
    """Run the exported drafter round in onnxruntime with the Python custom ops."""
    from dflash_trt.plugins import onnx_ops

    sess = onnx_ops.ort_session(onnx_path)
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v.detach().cpu().numpy() for k, v in inputs.items() if k in names})


def check_drafter_onnx(
    drafter,
    onnx_path,
    *,
    head_weight: torch.Tensor | None = None,
    page_size: int = 4,
    batch: int = 3,
    T: int = 4,
    seed: int = 1,
) -> dict:
    """onnxruntime vs PyTorch (``Drafter.inject`` + ``Drafter.draft``) on fresh inputs whose
    batch / T / cache sizes differ from the export's. Returns max abs errors per output."""
    import numpy as np

    inputs, cache = example_round(drafter, batch=batch, T=T, page_size=page_size, seed=seed)
    got = run_drafter_onnx(onnx_path, inputs)
    with torch.no_grad():
        drafter.inject(inputs["target_hidden"], inputs["n_new"], cache)
        hidden = drafter.draft(inputs["block_embeds"], cache)
        if head_weight is not None:
            head = nn.Linear(head_weight.shape[1], head_weight.shape[0], bias=False)
            head.weight = nn.Parameter(head_weight)
            hidden = drafter.logits(hidden, head)
    want = [hidden, cache.k, cache.v]
    names = ["logits" if head_weight is not None else "hidden", "k_cache", "v_cache"]
    return {n: float(np.abs(g - w.numpy()).max()) for n, g, w in zip(names, got, want, strict=True)}


# ---------------------------------------------------------------------------------------
# target
# ---------------------------------------------------------------------------------------


def target_export_problem(config) -> str | None:
    """Why a target's graph cannot carry its cache as two stacked tensors (None: it can).

    ``target.onnx`` stacks every layer's K and V into ``past_k`` / ``past_v`` [layers, b, kvh, P, d]:
    that needs one plain full-attention cache per layer, all of one shape. transformers builds a
    sliding-window layer (kept to the window) or a linear-attention layer (a recurrent and a conv
    state, which a rejected draft token must not enter) for other layer types."""
    from transformers import DynamicCache

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
        from transformers import DynamicCache

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
    from torch.export import Dim

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
    import numpy as np
    import onnxruntime as ort

    inputs = target_example_inputs(hf_model, **shape)
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {k: v.numpy() for k, v in inputs.items()})
    with torch.no_grad():
        want = TargetWithTaps(hf_model, layer_ids)(*(inputs[n] for n in TARGET_INPUTS))
    return {n: float(np.abs(g - w.numpy()).max()) for n, g, w in zip(TARGET_OUTPUTS, got, want, strict=True)}


# ---------------------------------------------------------------------------------------
# embedding
# ---------------------------------------------------------------------------------------


def export_embed_onnx(weight: torch.Tensor, scale: float, out_dir, *, filename: str = "embed.onnx") -> Path:
    """``embeds = weight[input_ids] * scale`` as a two-node graph (Gather, Mul): the drafter
    block's embedding (``model.Target.embed``) without the target's torch module."""
    onnx = require("onnx", "onnx", "ONNX export")
    from onnx import TensorProto, helper, numpy_helper

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
