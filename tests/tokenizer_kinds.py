"""Real tiny tokenizers of every kind the project supports, trained in-process with the ``tokenizers``
library (nothing downloaded), and a tiny target + drafter pair around each one.

Kinds: byte-level BPE (GPT-2 / Llama-3 / Qwen style), SentencePiece BPE with byte fallback
(Llama-2 / Mistral style), SentencePiece Unigram without byte fallback (T5 style, NFKC), word-level,
and a normalising WordPiece (BERT's lower-casing, accent-stripping normaliser, plus an upper-case
added token it can never produce). ``BROKEN`` holds tokenizers that are genuinely defective.
Every tokenizer ends with ``<mask>`` as its last id, the tiny drafter's mask token.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

CORPUS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "def f(x):\n    return x + 1\n",
    "Speculative decoding drafts a block and the target verifies it in one pass.",
    "Zürich, naïve café: ünïcödé text and 12345 numbers.",
    "lossless greedy output equals the target's own output",
] * 4
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]


def _byte_level_bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=SPECIALS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return tok


def _sentencepiece_byte_fallback() -> Tokenizer:
    """Llama-2's layout: Metaspace pieces, ``<0xNN>`` byte tokens for what the pieces miss."""
    base = Tokenizer(models.BPE(unk_token="<unk>"))
    base.pre_tokenizer = pre_tokenizers.Metaspace()
    base.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=160, special_tokens=SPECIALS, show_progress=False))
    trained = _model(base)["vocab"]
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in sorted(trained, key=trained.get):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in _model(base)["merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return tok


def _model(tok: Tokenizer) -> dict:
    return json.loads(tok.to_str())["model"]


def _sentencepiece_unigram() -> Tokenizer:
    """T5's layout: a Unigram model, NFKC and Metaspace, no byte fallback (unknown text is ``<unk>``)."""
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(
        CORPUS, trainers.UnigramTrainer(vocab_size=200, special_tokens=SPECIALS, unk_token="<unk>", show_progress=False)
    )
    return tok


def _word_level() -> Tokenizer:
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=SPECIALS, show_progress=False))
    return tok


def _normalising() -> Tokenizer:
    """BERT's normaliser (lower case, accents stripped) over WordPiece, and an upper-case added token."""
    tok = Tokenizer(models.WordPiece(unk_token="<unk>"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(
        CORPUS, trainers.WordPieceTrainer(vocab_size=200, special_tokens=SPECIALS, show_progress=False)
    )
    tok.add_tokens([AddedToken("Hello", normalized=True)])
    return tok


def _no_decoder() -> Tokenizer:
    """Broken: a byte-level vocabulary whose decoder is missing (replies come back as ``Ġ``-pieces)."""
    tok = _byte_level_bpe()
    tok.decoder = None
    return tok


def _wrong_decoder() -> Tokenizer:
    """Broken: SentencePiece pieces read back through a byte-level decoder."""
    tok = _sentencepiece_unigram()
    tok.decoder = decoders.ByteLevel()
    return tok


VALID = {
    "byte-level BPE": _byte_level_bpe,
    "SentencePiece byte fallback": _sentencepiece_byte_fallback,
    "SentencePiece unigram": _sentencepiece_unigram,
    "word-level": _word_level,
    "normalising WordPiece": _normalising,
}
BROKEN = {
    "byte-level without its decoder": (_no_decoder, "does not re-encode"),
    "SentencePiece with a byte-level decoder": (_wrong_decoder, "does not re-encode"),
}


def fast(tok: Tokenizer):
    """``tok`` as transformers' fast tokenizer, ``<mask>`` added as its last id."""
    from transformers import PreTrainedTokenizerFast

    tok.add_special_tokens([AddedToken("<mask>", special=True)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        mask_token="<mask>",
    )


def save_kind_pair(root: Path, build, arch: str = "qwen3") -> tuple[Path, Path]:
    """A tiny target whose vocabulary is the tokenizer's, its tokenizer, and a drafter; (target, drafter)."""
    import torch

    from tests.helpers import tiny_drafter, tiny_target

    tok = fast(build())
    vocab = max(tok.get_vocab().values()) + 1
    model = tiny_target(arch, dtype=torch.float32, vocab=vocab)
    model.config.eos_token_id = tok.eos_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    tdir, ddir = Path(root) / "target", Path(root) / "drafter"
    model.save_pretrained(tdir, safe_serialization=True)
    tok.save_pretrained(tdir)
    tiny_drafter(model).save(ddir)
    return tdir, ddir
