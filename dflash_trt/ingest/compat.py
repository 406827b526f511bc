"""Whether a target and a drafter belong together.

Everything here works from config files and safetensors headers: no tensor is loaded,
so ``build --dry-run`` and planning for 120B models can call it, also on config-only
directories (``require_weights=False``: what needs weights is reported as absent).
Each failure is one line naming the file, what is wrong and what to do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from dflash_trt.errors import CompatibilityError
from dflash_trt.ingest.drafter import DrafterSpec, read_drafter
from dflash_trt.ingest.target import TargetSpec, read_target
from dflash_trt.ingest.tokenizer import probe, probe_light
from dflash_trt.model import family_of


@dataclass
class PairReport:
    """The verdict on a (target, drafter) pair: every check, errors and warnings."""

    target: TargetSpec
    drafter: DrafterSpec
    checks: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def add(self, check: str, status: str, detail: str) -> None:
        self.checks.append({"check": check, "status": status, "detail": detail})
        if status == "error":
            self.errors.append(detail)
        elif status == "warn":
            self.warnings.append(detail)

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "errors": self.errors,
            "warnings": self.warnings,
            "checks": self.checks,
            "weights_present": {"target": self.target.weights.present, "drafter": self.drafter.weights.present},
        }


def _rope_equal(a: tuple, b: tuple) -> bool:
    (ta, sa), (tb, sb) = a, b
    if ta is None or tb is None or not math.isclose(ta, tb, rel_tol=1e-6):
        return False
    sa, sb = sa or {}, sb or {}
    kind = lambda s: s.get("rope_type", s.get("type", "default"))  # noqa: E731
    if kind(sa) != kind(sb):
        return False
    for k in set(sa) & set(sb) - {"rope_type", "type"}:
        x, y = sa[k], sb[k]
        numbers = isinstance(x, (int, float)) and isinstance(y, (int, float))
        same = math.isclose(x, y, rel_tol=1e-6) if numbers else x == y
        if not same:
            return False
    return True


def validate_pair(
    target_dir: str | Path, drafter_dir: str | Path, require_weights: bool = True, raise_on_error: bool = True
) -> PairReport:
    """Check that a drafter belongs to a target, from configs and safetensors headers alone.

    Unreadable/corrupt inputs raise ``CheckpointError``; a mismatched pair raises
    ``CompatibilityError`` with the first problem (``raise_on_error=False`` returns the
    report with ``.errors`` instead). Warnings are in ``.warnings``. The checks run in
    the order of ``PairReport.checks``: files, hidden size and heads, vocabulary and mask
    row, target layers, RoPE, dtype/quantization, tokenizer, draft head.
    """
    t = read_target(target_dir, require_weights=require_weights)
    d = read_drafter(drafter_dir, require_weights=require_weights)
    return check_pair(t, d, require_weights, raise_on_error)


def check_pair(t: TargetSpec, d: DrafterSpec, require_weights: bool = True, raise_on_error: bool = True) -> PairReport:
    """:func:`validate_pair` on specs already read (``ingest.read_pair``: each file read once)."""
    r = PairReport(t, d)
    _file_warnings(r, t, d, require_weights)
    _check_hidden_layout(r, t, d)
    _check_vocab_and_mask(r, t, d)  # may fill the drafter's missing vocab_size from the target
    _check_target_layers(r, t, d)
    _check_rope(r, t, d)
    _check_dtype(r, t, d)
    _check_tokenizer(r, t, require_weights)
    _check_capture(r, t, d)
    _check_family(r, t, d)
    if raise_on_error and r.errors:
        more = f" (+{len(r.errors) - 1} more: see dflash-trt inspect --target)" if len(r.errors) > 1 else ""
        raise CompatibilityError(r.errors[0] + more)
    return r


def _configs(t: TargetSpec, d: DrafterSpec) -> tuple[Path, Path]:
    """(drafter config.json, target config.json): the files the messages name."""
    return d.path / "config.json", t.path / "config.json"


def _file_warnings(r: PairReport, t: TargetSpec, d: DrafterSpec, require_weights: bool = True) -> None:
    """The files' warnings; absent weights are what a config-only read (plan, --dry-run) expects,
    so there they are a check's detail, not a warning the user could act on."""
    for check, spec in (("target files", t), ("drafter files", d)):
        for w in spec.warnings:
            r.add(check, "ok" if not require_weights and "weights absent" in w else "warn", w)


def _check_hidden_layout(r: PairReport, t: TargetSpec, d: DrafterSpec) -> None:
    """Hidden size (must match: the drafter reads the target's hidden states) and head layout."""
    c, (dcfg, tcfg) = d.config, _configs(t, d)
    if c.hidden_size == t.hidden_size:
        r.add("hidden size", "ok", f"{c.hidden_size}")
    else:
        r.add(
            "hidden size",
            "error",
            f"{dcfg}: drafter hidden_size {c.hidden_size} != target hidden_size "
            f"{t.hidden_size} ({tcfg}); this drafter was trained for another target: use the one published for it",
        )

    layout_d = (c.num_attention_heads, c.num_key_value_heads, c.head_dim)
    layout_t = (t.num_attention_heads, t.num_key_value_heads, t.head_dim)
    if layout_d == layout_t:
        r.add("head layout", "ok", f"{layout_d[0]} heads x {layout_d[2]}, {layout_d[1]} kv heads")
    else:
        r.add(
            "head layout",
            "warn",
            f"{dcfg}: drafter heads {layout_d[0]}x{layout_d[2]} (kv {layout_d[1]}) differ "
            f"from the target's {layout_t[0]}x{layout_t[2]} (kv {layout_t[1]}); unusual for DFlash: check head_dim",
        )


def _check_vocab_and_mask(r: PairReport, t: TargetSpec, d: DrafterSpec) -> None:
    """The vocabularies agree (a missing drafter vocab_size becomes the target's, in ``d.config``)
    and the mask token has a row in the target's embedding."""
    c, (dcfg, tcfg) = d.config, _configs(t, d)
    if "vocab_size" in d.defaulted:
        d.config = c = c.model_copy(update={"vocab_size": t.vocab_size})
        r.add("vocabulary", "warn", f"{dcfg}: no vocab_size; assuming the target's {t.vocab_size}")
    elif c.vocab_size != t.vocab_size:
        r.add(
            "vocabulary",
            "error",
            f"{dcfg}: drafter vocab_size {c.vocab_size} != target vocab_size "
            f"{t.vocab_size} ({tcfg}); the drafter was trained for another tokenizer",
        )
    else:
        r.add(
            "vocabulary",
            "ok",
            f"{c.vocab_size}" + (f", draft vocabulary {c.draft_vocab_size}" if c.draft_vocab_size else ""),
        )

    rows = t.embed_rows if t.embed_rows is not None else t.vocab_size
    src = f"{t.embed_tensor} in {t.weights.tensors[t.embed_tensor].file}" if t.embed_tensor else f"vocab_size, {tcfg}"
    if 0 <= c.mask_token_id < rows:
        r.add("mask token", "ok", f"id {c.mask_token_id} < {rows} embedding rows")
    else:
        r.add(
            "mask token",
            "error",
            f"{dcfg}: mask_token_id {c.mask_token_id} has no row in the target's {rows}-row "
            f"embedding ({src}); the drafter belongs to another model family",
        )


def _check_target_layers(r: PairReport, t: TargetSpec, d: DrafterSpec) -> None:
    """The layer ids the drafter reads exist in the target, once each, and its trained depth matches."""
    c, (dcfg, tcfg) = d.config, _configs(t, d)
    ids, depth = list(c.target_layer_ids), t.num_layers
    bad = [i for i in ids if not 0 <= i < depth]
    if bad:
        r.add(
            "target layer ids",
            "error",
            f"{dcfg}: target layer ids {bad} out of range for the {depth}-layer target{_layer_ids_fix(d, ids, depth)}",
        )
    else:
        r.add("target layer ids", "ok", f"{ids} of {depth} (output_hidden_states {[i + 1 for i in ids]})")
    if len(set(ids)) != len(ids):
        r.add("target layer ids", "warn", f"{dcfg}: target layer ids {ids} repeat a layer")

    if c.num_target_layers is None:
        r.add("target depth", "skip", "drafter config has no num_target_layers")
    elif c.num_target_layers != depth:
        r.add(
            "target depth",
            "error",
            f"{dcfg}: num_target_layers {c.num_target_layers} != the target's depth "
            f"{depth} ({tcfg}); the drafter was trained on another model",
        )
    else:
        r.add("target depth", "ok", f"{depth} layers")


def _layer_ids_fix(d: DrafterSpec, ids: list[int], depth: int) -> str:
    """What to do about out-of-range layer ids, from how they were published."""
    if d.norm.layer_convention == "output_hidden_states":
        return (
            f" (published as aux_hidden_state_layer_ids {d.published_layer_ids}, shifted back by one); "
            "the drafter was trained for a deeper target"
        )
    if max(ids) == depth:
        return (
            "; the largest id equals the depth, so these look like output_hidden_states indices (off by "
            "one): z-lab ids count decoder layers from 0, subtract 1 in dflash_config.target_layer_ids"
        )
    return "; the drafter was trained for a deeper target: use the drafter published for this model"


def _check_rope(r: PairReport, t: TargetSpec, d: DrafterSpec) -> None:
    """DFlash drafters use the target's RoPE; an omitted drafter rope_theta only warns. A target
    whose RoPE differs per layer type has none to match: the drafter keeps its own."""
    c, (dcfg, tcfg) = d.config, _configs(t, d)
    rope_d, rope_t = (c.rope_theta, c.rope_scaling), (t.rope_theta, t.rope_scaling)
    if t.rope_theta is None:  # RoPE per layer type (gemma-4: sliding and global differ): nothing to match
        r.add("rope", "ok", f"theta {c.rope_theta:g} (the drafter's own; the target's RoPE differs per layer type)")
    elif _rope_equal(rope_d, rope_t):
        r.add(
            "rope", "ok", f"theta {c.rope_theta:g}" + (f", {c.rope_scaling.get('rope_type')}" if c.rope_scaling else "")
        )
    else:
        msg = (
            f"{dcfg}: drafter RoPE (theta {c.rope_theta:g}, scaling {c.rope_scaling}) != target RoPE "
            f"(theta {t.rope_theta}, scaling {t.rope_scaling}) in {tcfg}"
        )
        if "rope_theta" in d.defaulted:
            r.add("rope", "warn", msg + "; the drafter config omits rope_theta: set it to the target's")
        else:
            r.add("rope", "error", msg + "; DFlash drafters use the target's RoPE: fix the drafter config")


def _check_dtype(r: PairReport, t: TargetSpec, d: DrafterSpec) -> None:
    """The drafter's dtype against the target's compute dtype, or the target's pre-quantization."""
    ddt, tdt = d.dtype, str(t.dtype or "?")
    if t.quantization:
        q = t.quantization
        r.add("dtype", "ok", f"drafter {ddt}; target pre-quantized {q.get('quant_algo')} ({q.get('source')})")
    elif ddt == tdt:
        r.add("dtype", "ok", ddt)
    else:
        r.add("dtype", "warn", f"drafter weights are {ddt}, target computes in {tdt}; the drafter is cast at load")


def _check_tokenizer(r: PairReport, t: TargetSpec, require_weights: bool) -> None:
    """With weights (inspect, build, the runtime) the tokenizer is loaded and probed; a config-only
    read (plan, --dry-run) names its files only, so planning stays free of torch."""
    if t.tokenizer_files and not require_weights:
        why = probe_light(t.path, t.vocab_size)
        if why:
            r.add("tokenizer", "error", why)
        else:
            r.add(
                "tokenizer",
                "ok",
                f"{', '.join(t.tokenizer_files)} (tokenizer.json: ids inside the vocabulary, "
                "its own text re-encodes; loaded with transformers when the bundle is built)",
            )
    elif t.tokenizer_files:
        why = probe(t.path, t.vocab_size)
        if why:
            r.add("tokenizer", "error", why)
        else:
            r.add(
                "tokenizer",
                "ok",
                f"{', '.join(t.tokenizer_files)} (loads, ids inside the vocabulary, its own text re-encodes)",
            )
    elif not require_weights:  # a config-only read (plan): the tokenizer is needed to serve, not to plan
        r.add("tokenizer", "ok", "absent (config-only directory; needed to serve, not to plan)")
    else:
        r.add(
            "tokenizer",
            "error",
            f"{t.path}: no tokenizer files (tokenizer.json / tokenizer_config.json / "
            "tokenizer.model); copy the model's tokenizer into the target directory",
        )


def _check_capture(r: PairReport, t: TargetSpec, d: DrafterSpec) -> None:
    """The target's LM head against TensorRT-LLM's DFlash loader (a reduced draft vocabulary needs its
    own). Whether TensorRT-LLM captures the target's hidden states is ``plan.trtllm_capture``'s verdict
    (``inspect`` and ``build`` read it there)."""
    c = d.config
    if c.draft_vocab_size:
        r.add(
            "draft head",
            "warn",
            f"{d.path}: reduced draft vocabulary ({c.draft_vocab_size}) with its own "
            "lm_head; TensorRT-LLM's DFlash loader uses the target's LM head instead, which destroys "
            "acceptance: serve this drafter with the reference runtime or use a full-vocabulary drafter",
        )


def _check_family(r: PairReport, t: TargetSpec, d: DrafterSpec) -> None:
    """What the drafter's family adds to the pair check (``DrafterFamily.pair_check``; DFlash2: its
    selector's top-k fits the target's vocabulary, its convolution groups tile the hidden size)."""
    c, (dcfg, _) = d.config, _configs(t, d)
    said = family_of(c).pair_check(c, t.hidden_size, t.vocab_size)
    if said is not None:
        status, message = said
        r.add(c.family or family_of(c).name, status, f"{dcfg}: {message}" if status == "error" else message)
