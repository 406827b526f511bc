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

SHAPE_FIELDS = ("block_size", "layers", "target_layer_ids", "mask_token_id", "arch", "conv_kernel_size",
                "conv_group_size", "selector_rank", "selector_top_k")
DATA_FIELDS = ("target", "data", "prompt_len", "gen_len", "window_stride", "samples", "eval_prompts", "seed",
               "chat_template", "thinking")
RESUMABLE_FIELDS = ("steps", "eval_every", "eval_data", "save_every", "regen_endpoint", "regen_model",
                    "regen_concurrency", "feature_cache", "feature_shard_mb", "device", "parallel")


@dataclass
class TrainSettings:
    target: str
    data: str
    out: str
    block_size: int | None = None          # default 8
    layers: int | None = None              # default 1
    target_layer_ids: list[int] | None = None
    mask_token_id: int | None = None       # default: the tokenizer's mask token, else a spare row
    arch: str | None = None                # a drafter family (model.DRAFTER_FAMILIES): "dflash" (default), "dflash2"
    conv_kernel_size: int | None = None    # DFlash2 only (defaults: objective.SelectorObjective.defaults)
    conv_group_size: int | None = None
    selector_rank: int | None = None
    selector_top_k: int | None = None
    steps: int = 1000
    batch_size: int = 8                       # the global batch: sequences per step over all ranks
    anchors: int = 16
    lr: float = 6e-4
    warmup: float = 0.04
    weight_decay: float = 0.01
    prompt_len: int = 64
    gen_len: int = 128
    window_stride: int | None = None          # a text window starts every N tokens; None: prompt_len + gen_len
    samples: int = 1024
    eval_prompts: int = 8
    eval_every: int = 100
    #: held-out τ on prompts cut from this data (JSONL or text, like ``data``) rather than on
    #: ``eval_prompts`` windows held back from ``data``: files the drafter never saw rank
    #: candidates the way ``dflash-trt bench`` on held-out prompts does
    eval_data: str | None = None
    eval_tokens: int = 64
    save_every: int = 100
    seed: int = 0
    save_dtype: str = "bfloat16"
    resume: bool = False
    chat_template: bool = False               # JSONL prompts through the target's chat template
    thinking: bool | None = None           # the template's enable_thinking (None: its default)
    regen_endpoint: str | None = None      # OpenAI-compatible server URL; None: the reference runtime
    regen_model: str | None = None         # the model the server serves (None: the first it lists)
    regen_concurrency: int = 32
    feature_cache: str | None = None       # folder of target_hidden shards; None: computed online
    feature_shard_mb: float = 1024.0
    device: str = "auto"                      # auto: cuda:LOCAL_RANK when CUDA is available, else cpu
    parallel: str = "auto"                    # fsdp | ddp | none; auto: fsdp under torchrun, none alone
    target_dtype: str = "auto"                # the frozen target's precision; auto: as it ships (else bf16)


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
    losses: list[float] = field(default_factory=list)   # every step of this invocation
    grad_norms: list[float] = field(default_factory=list)   # before clipping, every step of this invocation
