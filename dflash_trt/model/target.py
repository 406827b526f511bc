"""The target as DFlash sees it: embedding, LM head, and a forward that also returns ``target_hidden``.

:class:`Target` wraps any transformers causal LM. ``target_hidden`` (the DFlash authors' word,
used throughout this package) is the concatenation of the hidden states of the target layers
the drafter conditions on (``target_layer_ids``): layer id ``i`` is the output of decoder layer ``i``, i.e.
``output_hidden_states[i + 1]`` in transformers (the DFlash paper's convention). A target whose
residual is several hyper-connection streams (DeepSeek V4: ``hc_mult`` of them, hidden states
[b, T, hc_mult, H]) is tapped where TensorRT-LLM taps it for DFlash and EAGLE-3: the output of
layer ``i``'s MoE block, [b, T, H], before it is mixed back into the streams
(``tensorrt_llm/_torch/models/modeling_deepseekv4.py``, ``DeepseekV4DecoderLayer.forward_MoE``).
GLM-5.3-Flash (``glm5_next``) has no such capture in TensorRT-LLM (its ``Glm5NextDecoderLayer.forward``
never sees ``spec_metadata``; only its MTP layer is fed, with ``norm(mean of the streams)``) and no
published DFlash drafter, so its tap is chosen here: layer ``i``'s output streams collapsed by the
model's own head, ``hc_head`` (an unweighted mean over the ``hc_mult`` streams, TensorRT-LLM's
``glm5_next_hyper_head``), [b, T, H]. It is the one reduction the model itself applies to a layer's
streams (the last layer's, before the final norm), so tap ``i`` is what the model would hand its
head had it stopped after layer ``i``: the hyper-connection analogue of ``output_hidden_states[i + 1]``.
The tap changes acceptance only, never the output (the target verifies every token).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dflash_trt.errors import CheckpointError

#: hyper-connection targets whose target_hidden is each tapped layer's streams through ``hc_head``
STREAM_MEAN_TAPS = frozenset({"glm5_next"})


class Target:
    """A transformers causal LM seen through what DFlash needs from it."""

    def __init__(self, model: nn.Module, layer_ids: list[int] | None = None):
        self.model = model.eval()
        self.layer_ids = list(layer_ids or [])
        self.config: Any = model.config  # a transformers PretrainedConfig
        # transformers 5.x renamed past_key_values to cache; accept either generation.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        text = self.config.get_text_config() if hasattr(self.config, "get_text_config") else self.config
        self._stream_taps = text.model_type.removesuffix("_text") in STREAM_MEAN_TAPS
        self._mlp_taps = getattr(text, "hc_mult", None) is not None and not self._stream_taps

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.get_input_embeddings().weight.dtype

    @property
    def num_layers(self) -> int:
        cfg = self.config.get_text_config() if hasattr(self.config, "get_text_config") else self.config
        return int(cfg.num_hidden_layers)

    def embed(self, ids: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """The target's own input embedding of ``ids`` [b, T] -> [b, T, H], as the z-lab reference
        takes it (``target.model.embed_tokens(block)`` in ``DFlashDraftModel.spec_generate``):
        plain rows for Qwen/Llama, rows x sqrt(hidden) for Gemma's scaled embedding; then
        the drafter's ``input_embedding_scale``."""
        module = self.model.get_input_embeddings()
        emb = module(ids) if isinstance(module, nn.Embedding) else F.embedding(ids, module.weight)
        return emb * scale if scale != 1.0 else emb

    @property
    def head(self) -> nn.Module:
        head = getattr(self.model, "lm_head", None)
        return head if head is not None else self.model.get_output_embeddings()

    def forward(self, ids, position_ids, attention_mask, cache, capture: bool = True):
        """Returns (logits [b, T, V], target_hidden [b, T, n_tap*H] or None)."""
        want_hidden = capture and bool(self.layer_ids)
        if want_hidden and (self._mlp_taps or self._stream_taps):
            return self._forward_hooked_taps(ids, position_ids, attention_mask, cache)
        out = self.model(
            input_ids=ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            use_cache=True,
            output_hidden_states=want_hidden,
            **{self._cache_kw: cache},
        )
        if want_hidden:
            return out.logits, torch.cat([out.hidden_states[i + 1] for i in self.layer_ids], dim=-1)
        return out.logits, None

    def _forward_hooked_taps(self, ids, position_ids, attention_mask, cache):
        """``forward`` for hyper-connection targets: target_hidden from the tapped layers' MoE
        outputs, or (``STREAM_MEAN_TAPS``) their output streams [b, T, hc, H] through ``hc_head``."""
        decoder = self.model.get_decoder()
        layers = decoder.layers
        taps: dict[int, torch.Tensor] = {}
        if self._stream_taps:
            hooks = [
                layers[i].register_forward_hook(lambda _m, _a, out, i=i: taps.__setitem__(i, decoder.hc_head(out[0])))
                for i in self.layer_ids
            ]
        else:
            hooks = [
                layers[i].mlp.register_forward_hook(lambda _m, _a, out, i=i: taps.__setitem__(i, out))
                for i in self.layer_ids
            ]
        try:
            out = self.model(
                input_ids=ids,
                position_ids=position_ids,
                attention_mask=attention_mask,
                use_cache=True,
                **{self._cache_kw: cache},
            )
        finally:
            for h in hooks:
                h.remove()
        return out.logits, torch.cat([taps[i] for i in self.layer_ids], dim=-1)


def load_target(path: str | Path, dtype: torch.dtype | None = None, device: str = "cpu") -> nn.Module:
    """Load a Hugging Face causal LM from a local directory (safetensors only, no remote code)."""
    from transformers.utils import (
        logging as hf_logging,
    )  # start-up: transformers (runtime, export, deploy load this module without it)

    hf_logging.disable_progress_bar()  # our own progress reporting; keep stderr to one line per event
    path = Path(path)
    if not (path / "config.json").exists():
        raise CheckpointError(f"{path}: no config.json; is this a Hugging Face model directory?")
    if not any(path.glob("*.safetensors")):
        raise CheckpointError(f"{path}: no .safetensors weights (pickled .bin weights are refused)")
    try:
        model = _auto_class(path).from_pretrained(
            str(path),
            dtype=dtype or "auto",
            use_safetensors=True,
            trust_remote_code=False,
        )
    except (ValueError, OSError, KeyError) as exc:
        raise CheckpointError(f"{path}: cannot load target: {str(exc).splitlines()[0]}") from exc
    return model.to(device).eval()


def _auto_class(path: Path):
    """AutoModelForCausalLM, or for a VLM it does not map (Kimi K2.5's ``kimi_k25``) the
    image-text-to-text class: served text-only, its vision tower loaded but never called."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText  # start-up: transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # start-up: transformers

    try:
        model_type = AutoConfig.from_pretrained(str(path), trust_remote_code=False).model_type
    except (ValueError, OSError, KeyError):
        return AutoModelForCausalLM  # its own error names the problem
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return AutoModelForCausalLM
    return AutoModelForImageTextToText
