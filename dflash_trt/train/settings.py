"""What a training run is started with (:class:`TrainSettings`), what it reports while it runs
(:class:`Progress`) and what it returns (:class:`Result`).

The fields fall in three groups, which decide what ``--resume`` may change:

* ``SHAPE_FIELDS`` fix the drafter's shape; a resume that names another value is refused;
* ``DATA_FIELDS`` fix the regenerated training set (a change means a new set);
* ``RESUMABLE_FIELDS`` say how long, how often and where the work happens, not what it
  computes: a resumed run takes them from its command line (another number of steps, another
  regeneration server after a crash, another feature-cache folder, another device), and
  everything else from the run's saved settings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SHAPE_FIELDS = (
    "block_size",
    "layers",
    "target_layer_ids",
    "mask_token_id",
    "arch",
    "conv_kernel_size",
    "conv_group_size",
    "selector_rank",
    "selector_top_k",
)
DATA_FIELDS = (
    "target",
    "data",
    "prompt_len",
    "gen_len",
    "window_stride",
    "samples",
    "eval_prompts",
    "seed",
    "chat_template",
    "thinking",
)
RESUMABLE_FIELDS = (
    "steps",
    "eval_every",
    "eval_data",
    "save_every",
    "regen_endpoint",
    "regen_model",
    "regen_concurrency",
    "feature_cache",
    "feature_shard_mb",
    "device",
    "parallel",
)


def _opt(default: Any, help: str, *, min: float | None = None) -> Any:  # noqa: A002 - the option's words
    """A field whose description is its ``--help`` text (``train.options`` builds the flags from it)."""
    return Field(default, description=help, json_schema_extra={"min": min} if min is not None else None)


class TrainSettings(BaseModel):
    """A training run's settings: ``dflash-trt train-drafter``'s and ``python -m dflash_trt.train``'s
    options (``--kebab-case`` of each field), a ``--config`` YAML of them, and ``--set KEY=VALUE``.
    Values are checked where they are used (``checks.preflight``): a bad number is a one-line error."""

    model_config = ConfigDict(extra="forbid")

    target: str = _opt(..., "Target: local Hugging Face directory, hub id, or embedded:NAME (embedded:tiny/target).")
    data: str = _opt(..., "Prompts: JSONL with 'prompt', a text file, or a folder of text files (cut into prompts).")
    out: str = _opt(..., "Output directory: the z-lab drafter, plus .train/ (checkpoint, regenerated data).")
    block_size: int | None = _opt(None, "Block size B (anchor + B-1 drafts). Default 8.", min=2)
    layers: int | None = _opt(None, "Drafter decoder layers. Default 1 (z-lab uses 5 for 8B targets).", min=1)
    target_layer_ids: list[int] | None = _opt(
        None,
        "Tapped target layers, e.g. 1,9,17,25,33 (z-lab ids: output of layer i). Default: spread from 1 to depth-3.",
    )
    mask_token_id: int | None = _opt(
        None, "Embedding row used as MASK. Default: the tokenizer's mask token, else the first spare row.", min=0
    )
    arch: str | None = _opt(
        None,
        "Drafter: dflash (DFlashDraftModel) or dflash2 (DFlash2DraftModel: dynamic convolutions around every "
        "sublayer and a candidate selector, trained with the same block objective). Default dflash.",
    )
    conv_kernel_size: int | None = _opt(None, "DFlash2: taps of each dynamic convolution. Default 2.", min=1)
    conv_group_size: int | None = _opt(
        None, "DFlash2: channels sharing one dynamic tap (divides the hidden size). Default 16.", min=1
    )
    selector_rank: int | None = _opt(None, "DFlash2: rank of the selector's codebooks. Default 256.", min=1)
    selector_top_k: int | None = _opt(
        None, "DFlash2: candidates per block position the selector chooses among. Default 16.", min=2
    )
    steps: int = _opt(1000, "Total optimizer steps (with --resume: continue up to this).", min=1)
    batch_size: int = _opt(8, "Sequences per step (the global batch, over all ranks).", min=1)
    anchors: int = _opt(16, "Random anchor positions (blocks) per sequence.", min=1)
    lr: float = _opt(6e-4, "AdamW peak learning rate (linear warm-up, cosine decay to 10%).", min=0.0)
    warmup: float = _opt(0.04, "Fraction of the steps the learning rate warms up over.", min=0.0)
    weight_decay: float = _opt(0.01, "AdamW weight decay.", min=0.0)
    prompt_len: int = _opt(64, "Prompt tokens per training sequence.", min=2)
    gen_len: int = _opt(128, "Response tokens the target regenerates per prompt.", min=1)
    window_stride: int | None = _opt(
        None,
        "Text data: a prompt window starts every N tokens. Default --prompt-len + --gen-len (windows never "
        "overlap the text they continue); smaller draws more prompts from a small corpus.",
        min=1,
    )
    samples: int = _opt(1024, "Training sequences to regenerate.", min=1)
    eval_prompts: int = _opt(8, "Prompt windows held back from --data for the held-out τ.", min=1)
    eval_every: int = _opt(100, "Steps between held-out τ measurements.", min=1)
    eval_data: str | None = _opt(
        None,
        "Held-out τ on prompts cut from this data (JSONL or text, as --data), e.g. files kept out of "
        "training. Default: 8 windows held back from --data, which share its files and read higher than "
        "`dflash-trt bench` on held-out prompts.",
    )
    eval_tokens: int = _opt(64, "Tokens generated per held-out prompt for the held-out τ.", min=1)
    save_every: int = _opt(100, "Steps between checkpoints.", min=1)
    seed: int = _opt(0, "Seed for data order, anchors and initialisation.")
    save_dtype: Literal["bfloat16", "float16", "float32"] = _opt(
        "bfloat16", "Precision the drafter is written in: bfloat16, float16 or float32."
    )
    resume: bool = _opt(False, "Continue the run saved in --out.")
    chat_template: bool = _opt(
        False, "Format JSONL prompts with the target's chat template (lines with 'messages' always are)."
    )
    thinking: bool | None = _opt(
        None, "The chat template's enable_thinking (Qwen3); recorded in training.json. Default: the template's own."
    )
    regen_endpoint: str | None = _opt(
        None,
        "OpenAI-compatible server (trtllm-serve, vLLM, SGLang, dflash-trt serve) that regenerates the "
        "responses. Default: the reference runtime in this process.",
    )
    regen_model: str | None = _opt(None, "Model name to ask --regen-endpoint for. Default: the first it lists.")
    regen_concurrency: int = _opt(
        32,
        "Requests in flight to --regen-endpoint, per rank; without an endpoint, rows per batch of the "
        "in-process regeneration.",
        min=1,
    )
    feature_cache: str | None = _opt(
        None,
        "Feature folder: the target's hidden states as safetensors shards (README: 'The feature folder'), "
        "written once by this run or converted from a serving engine's capture, checked, then read by every "
        "step and rank. Default: online.",
    )
    feature_shard_mb: float = _opt(1024.0, "Size of one --feature-cache shard, in MB.", min=0.001)
    device: str = _opt("auto", "Device: auto (cuda:LOCAL_RANK when CUDA is available, else cpu), cpu, cuda:N.")
    parallel: str = _opt(
        "auto",
        "torch's engine over the ranks: fsdp (FSDP2: drafter, its AdamW state and the target's decoder "
        "layers sharded), ddp (whole copies, gradients all-reduced) or none (one process). Default auto: "
        "fsdp with several ranks, none alone.",
    )
    target_dtype: str = _opt(
        "auto",
        "Precision of the frozen target: bfloat16, float16, float32, or auto (as it ships; bfloat16 when "
        "its config names none).",
    )


@dataclass
class Progress:
    """Callbacks the CLI turns into progress bars (all optional)."""

    phase: Callable[[str, int], None] = lambda name, total: None
    advance: Callable[[int, dict], None] = lambda done, info: None
    log: Callable[[str], None] = lambda line: None


@dataclass
class Result:
    out: Path
    step: int
    loss: float
    train_tau: float
    heldout_tau: float | None
    seconds: float
    history: list[dict] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # every step of this invocation
    grad_norms: list[float] = field(default_factory=list)  # before clipping, every step of this invocation
