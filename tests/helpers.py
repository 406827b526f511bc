"""Tiny models built in-process: never downloaded, a few hundred kB each."""

from __future__ import annotations

import torch

from dflash_trt.model.config import DrafterConfig
from dflash_trt.model.dflash2 import DFlash2Drafter
from dflash_trt.model.drafter import Drafter
from dflash_trt.model.target import Target

VOCAB = 96
MASK_ID = VOCAB - 1


def tiny_target(
    arch: str = "qwen3", layers: int = 4, hidden: int = 64, seed: int = 0, dtype=torch.float64, vocab: int = VOCAB
):
    """A random tiny Qwen3 or Llama causal LM (float64 so argmax ties cannot flake)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**common))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common, rope_theta=10000.0))
    else:
        raise ValueError(arch)
    # Wider than the default init: the default makes tiny models repeat one token
    # forever, which would make "lossless" a weak claim. std 0.2 gives varied text.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    return model.to(dtype).eval()


def tiny_drafter_config(target, block_size: int = 8, layers: int = 2, **kw) -> DrafterConfig:
    cfg = target.config
    n = cfg.num_hidden_layers
    args = dict(
        hidden_size=cfg.hidden_size,
        intermediate_size=2 * cfg.hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        vocab_size=cfg.vocab_size,
        block_size=block_size,
        mask_token_id=cfg.vocab_size - 1,
        target_layer_ids=sorted({0, n // 2, n - 2}),
        num_target_layers=n,
        rope_theta=getattr(cfg, "rope_theta", None) or 10000.0,
        max_position_embeddings=cfg.max_position_embeddings,
    )
    args.update(kw)
    return DrafterConfig(**args)


def tiny_drafter(target, seed: int = 1, **kw) -> Drafter:
    torch.manual_seed(seed)
    d = Drafter(tiny_drafter_config(target, **kw))
    for p in d.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.2)
    return d.to(target.dtype).eval()


#: DFlash2 sizes for tiny drafters (the published ones are 2 taps, groups of 16, rank 256, top-16).
DFLASH2 = dict(conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=4)


def tiny_dflash2_drafter(target, seed: int = 1, **kw) -> DFlash2Drafter:
    """A random DFlash2 drafter (every weight random, the convolutions and codebooks included)."""
    torch.manual_seed(seed)
    d = DFlash2Drafter(tiny_drafter_config(target, **{**DFLASH2, **kw}))
    for p in d.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.2)
    return d.to(target.dtype).eval()


def prompts(n: int, seed: int = 0, lo: int = 1, hi: int = 40, vocab: int = VOCAB) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(lo, hi + 1, (1,), generator=g))
        out.append(torch.randint(3, vocab - 1, (length,), generator=g).tolist())
    return out


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """The target's own greedy decoding (transformers generate), generated tokens only."""
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def wrap(model, drafter=None) -> Target:
    return Target(model, drafter.cfg.target_layer_ids if drafter is not None else None)


class OracleDrafter(Drafter):
    """Test double: proposes the target's true greedy continuation.

    ``truth[row]`` is prompt + the target's greedy continuation for each original row.
    ``wrong(round, row)`` may return a draft position k (1..B-1) to corrupt in that round,
    which makes the target reject from k on (partial acceptance).
    """

    def __init__(self, cfg: DrafterConfig, truth: list[list[int]], wrong=lambda rnd, row: None):
        super().__init__(cfg)
        self.truth, self.wrong, self.round = truth, wrong, 0
        self._tokens = None

    def new_cache(self, batch, device=None, page_size=16):
        cache = super().new_cache(batch, device, page_size)
        cache.row_ids = torch.arange(batch)
        plain_select = cache.select

        def select(rows):
            plain_select(rows)
            cache.row_ids = cache.row_ids[rows]

        cache.select = select
        return cache

    def inject(self, target_hidden, n_new, cache):
        cache.lengths = cache.lengths + n_new

    def draft(self, block_embeds, cache):
        b, B, _ = block_embeds.shape
        toks = torch.zeros(b, B, dtype=torch.long)
        for r in range(b):
            row = int(cache.row_ids[r])
            seq, n = self.truth[row], int(cache.lengths[r])
            for t in range(1, B):
                toks[r, t] = seq[n + t] if n + t < len(seq) else 0
            k = self.wrong(self.round, row)
            if k is not None and 1 <= k < B:
                toks[r, k] = (toks[r, k] + 1) % (self.cfg.vocab_size - 1)
        self.round += 1
        self._tokens = toks
        return block_embeds

    def logits(self, hidden, target_head):
        onehot = torch.nn.functional.one_hot(self._tokens[:, 1:], self.cfg.vocab_size)
        return onehot.to(hidden.dtype) * 50.0


def char_tokenizer(vocab: int = VOCAB):
    """A character-level fast tokenizer: 0 pad, 1 bos, 2 eos, printable ASCII, last id <mask>."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)][: vocab - 4]
    table = {"<pad>": 0, "<s>": 1, "</s>": 2}
    table.update({c: i + 3 for i, c in enumerate(chars)})
    table["<mask>"] = vocab - 1
    tok = Tokenizer(models.WordLevel(table, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", mask_token="<mask>"
    )


def save_pair(root, arch: str = "qwen3", block_size: int = 8, dflash2: bool = False):
    """Write target (HF + tokenizer) and drafter (z-lab; ``dflash2``: a DFlash2 one) directories;
    returns (target, drafter)."""
    from pathlib import Path

    root = Path(root)
    model = tiny_target(arch, dtype=torch.float32)
    drafter = (tiny_dflash2_drafter if dflash2 else tiny_drafter)(model, block_size=block_size)
    tdir, ddir = root / "target", root / "drafter"
    model.save_pretrained(tdir, safe_serialization=True)
    char_tokenizer().save_pretrained(tdir)
    drafter.save(ddir)
    return tdir, ddir
