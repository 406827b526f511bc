"""The DFlash drafter as a plain torch module.

Read top to bottom:

* :class:`DrafterConfig` (in ``config.py``) is the one description every drafter format
  normalises to (``ingest`` does the normalising; z-lab is the native form).
* :class:`Drafter` holds the published tensors under their published names
  (``layers.{i}.self_attn.q_proj.weight``, ``fc.weight``, ``hidden_norm.weight``, ...).
  ``inject`` turns tapped target hidden states into every layer's context K/V
  (KV injection); ``draft`` runs one block ``[anchor, MASK x (B-1)]`` through the
  layers in one forward (block-diffusion attention) and returns the block's hidden
  states.
* :class:`~dflash_trt.model.target.Target` (in ``target.py``) is the target side.

The two DFlash-specific operations are called through ``dflash_trt.plugins`` so the
reference and the Triton kernels are interchangeable (``kernels=``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from dflash_trt import plugins
from dflash_trt.errors import CheckpointError
from dflash_trt.model.config import DrafterConfig

# ---------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, as Hugging Face's Llama/Qwen3 do."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return plugins.rms_norm(x, self.weight, self.eps)


def rope_inv_freq(cfg: DrafterConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and attention scaling, through transformers' RoPE variants."""
    from transformers import Qwen3Config  # start-up: transformers (runtime, export, deploy load this module without it)
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding  # start-up: transformers

    hf = Qwen3Config(
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        head_dim=cfg.head_dim,
        rope_theta=cfg.rope_theta,
        rope_scaling=cfg.rope_scaling,
        max_position_embeddings=cfg.max_position_embeddings,
    )
    emb = Qwen3RotaryEmbedding(hf)
    return emb.inv_freq.float().clone(), float(emb.attention_scaling)


class Attention(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        h, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)


class MLP(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


# ---------------------------------------------------------------------------------------
# The drafter
# ---------------------------------------------------------------------------------------


class Drafter(nn.Module):
    """DFlash drafter: context fusion, per-layer KV injection, one-forward block drafting."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        n_tap = len(cfg.target_layer_ids)
        self.fc = nn.Linear(n_tap * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.draft_vocab_size:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        else:
            self.lm_head = None
            self.d2t = None
        inv_freq, scaling = rope_inv_freq(cfg)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.rope_scaling_factor = scaling
        self.kernels = "reference"

    # -- RoPE --------------------------------------------------------------------------
    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of shape [*positions.shape, head_dim] (the rotate-half layout)."""
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.rope_scaling_factor).to(dtype), (emb.sin() * self.rope_scaling_factor).to(dtype)

    # -- KV injection --------------------------------------------------------------------
    def inject(self, target_hidden: torch.Tensor, n_new: torch.Tensor, cache: plugins.PagedKVCache) -> None:
        """Append context K/V for newly committed tokens to every layer's cache.

        target_hidden: [b, T, n_tap*H] target hidden states (padded to T); n_new: [b] how many of
        the T are real for each sequence. They land at positions ``cache.lengths[i] + t``.
        """
        plugins.kv_injection(self, target_hidden, n_new, cache, kernels=self.kernels)

    # -- block drafting ------------------------------------------------------------------
    def draft(self, block_embeds: torch.Tensor, cache: plugins.PagedKVCache) -> torch.Tensor:
        """One forward over the block. block_embeds: [b, B, H]; returns normed hidden [b, B, H].

        Block position t of sequence i sits at absolute position ``cache.lengths[i] + t``:
        the context holds exactly the committed tokens before the anchor.
        """
        cfg = self.cfg

        def attend(i, q, k, v):
            return plugins.block_attention(
                q,
                k,
                v,
                cache.k[i],
                cache.v[i],
                cache.page_table,
                cache.lengths,
                causal=cfg.layer_causal(i),
                window=cfg.layer_window(i),
                scale=cfg.head_dim**-0.5,
                kernels=self.kernels,
            )

        B = block_embeds.shape[1]
        positions = cache.lengths[:, None] + torch.arange(B, device=block_embeds.device)
        return self.block_forward(block_embeds, positions, attend)

    def block_forward(
        self, block_embeds: torch.Tensor, positions: torch.Tensor, attend, block_len: int | None = None
    ) -> torch.Tensor:
        """The layer stack over block tokens at absolute ``positions`` [b, B];
        ``attend(layer, q, k, v)`` is block-diffusion attention over that layer's context.
        The paged-cache runtime, the ONNX export and training (many blocks per row, one
        masked attention) all run this one loop. ``block_len``: the length of each block when
        the B positions hold several back to back (training); only DFlash2's convolutions,
        which must not cross a block boundary, read it."""
        cos, sin = self.rope(positions, block_embeds.dtype)
        x = block_embeds
        for i, layer in enumerate(self.layers):
            x = x + self.attention(i, layer.input_layernorm(x), cos, sin, attend)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)

    def attention(self, i: int, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend) -> torch.Tensor:
        """Layer ``i``'s attention sublayer on its normed input h [b, B, H] (q/k/v, norms, RoPE,
        ``attend``, o_proj); returns [b, B, H]."""
        cfg, attn = self.cfg, self.layers[i].self_attn
        b, B, _ = h.shape
        q = attn.q_norm(attn.q_proj(h).view(b, B, cfg.num_attention_heads, cfg.head_dim))
        k = attn.k_norm(attn.k_proj(h).view(b, B, cfg.num_key_value_heads, cfg.head_dim))
        v = attn.v_proj(h).view(b, B, cfg.num_key_value_heads, cfg.head_dim)
        q, k = plugins.apply_rope(q, cos, sin), plugins.apply_rope(k, cos, sin)
        return attn.o_proj(attend(i, q, k, v).reshape(b, B, -1))

    def logits(self, hidden: torch.Tensor, target_head: nn.Module) -> torch.Tensor:
        """Draft logits over the *target* vocabulary.

        With a reduced draft vocabulary (speculators), the drafter's own head scores the
        draft vocabulary and ``d2t`` places it in the target's; other ids get -inf.
        """
        cfg = self.cfg
        if self.lm_head is not None:
            small = self.lm_head(hidden)
            out = hidden.new_full((*hidden.shape[:-1], cfg.vocab_size), float("-inf"))
            logits = out.scatter(-1, self.d2t.expand(*small.shape[:-1], -1), small)
        else:
            logits = target_head(hidden)
        if cfg.output_multiplier != 1.0:
            logits = logits * cfg.output_multiplier
        if cfg.final_logit_softcapping:
            cap = cfg.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def new_cache(self, batch: int, device=None, page_size: int = 16) -> plugins.PagedKVCache:
        cfg = self.cfg
        return plugins.PagedKVCache(
            num_layers=cfg.num_hidden_layers,
            batch=batch,
            num_kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            page_size=page_size,
            device=device or self.fc.weight.device,
            dtype=self.dtype,
        )

    # -- persistence ---------------------------------------------------------------------
    def save(self, out_dir: str | Path) -> None:
        """Write z-lab form: config.json + model.safetensors (no ``model.`` prefix)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        cfg = self.cfg.to_zlab()
        cfg["dtype"] = str(self.fc.weight.dtype).removeprefix("torch.")
        (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})

    @classmethod
    def from_state(
        cls, cfg: DrafterConfig, state: dict[str, torch.Tensor], dtype: torch.dtype | None = None
    ) -> Drafter:
        model = cls(cfg)
        expected = model.state_dict()
        missing = sorted(set(expected) - set(state))
        unexpected = sorted(set(state) - set(expected))
        if missing or unexpected:
            raise CheckpointError(
                f"drafter tensors do not match its config: missing {missing[:3]}, unexpected "
                f"{unexpected[:3]}; is this a z-lab-format DFlash drafter?"
            )
        for name, tensor in state.items():
            if tuple(tensor.shape) != tuple(expected[name].shape):
                raise CheckpointError(
                    f"drafter tensor {name} has shape {tuple(tensor.shape)}, config implies "
                    f"{tuple(expected[name].shape)}"
                )
        model.load_state_dict(state)
        if dtype is not None:
            model.to(dtype)
            if model.d2t is not None:
                model.d2t = model.d2t.long()
        return model.eval()

    @classmethod
    def load(cls, path: str | Path, dtype: torch.dtype | None = None) -> Drafter:
        """Load a z-lab-format drafter directory (other formats: ``ingest.load_drafter``)."""
        path = Path(path)
        try:
            cfg = DrafterConfig.from_zlab(json.loads((path / "config.json").read_text()))
        except FileNotFoundError as exc:
            raise CheckpointError(f"{path}: no config.json; is this a drafter directory?") from exc
        state: dict[str, torch.Tensor] = {}
        for f in sorted(path.glob("*.safetensors")):
            state.update(load_file(str(f)))
        if not state:
            raise CheckpointError(f"{path}: no .safetensors weights")
        return cls.from_state(cfg, state, dtype=dtype)
