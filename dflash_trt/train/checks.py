"""The checks a training run passes before any work is done: OUT (a fresh run, or the resume of
the run it holds: the settings then come from OUT), every number in range, the data readable.

Invariant: nothing here writes, and each refusal is one ``DFlashError`` line. A launcher makes
them once before it starts its ranks (:func:`preflight`); every rank makes them again before
rank 0 writes (``loop._train``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlsplit

from dflash_trt.errors import DFlashError
from dflash_trt.train import data as train_data
from dflash_trt.train import regen
from dflash_trt.train.checkpoint import check_confined, reading_state, saved_step
from dflash_trt.train.settings import RESUMABLE_FIELDS, SHAPE_FIELDS, TrainSettings


def prepare(s: TrainSettings, out: Path, work: Path) -> TrainSettings:
    """Validate OUT for a fresh run or a resume; returns the settings to run with."""
    check_confined(out)
    if s.resume:
        if not (work / "settings.json").exists():
            raise DFlashError(f"--resume: {out} holds no training run to resume")
        with reading_state(work):
            saved = json.loads((work / "settings.json").read_text())
            if not isinstance(saved, dict):
                raise ValueError("settings.json is not an object")
        saved.setdefault("arch", "dflash")  # runs saved before --arch existed trained DFlash drafters
        saved.setdefault("target_dtype", "float32")  # and before --target-dtype, a float32 target
        for name in SHAPE_FIELDS:
            mine, theirs = getattr(s, name), saved.get(name)
            if mine is not None and mine != theirs:
                raise DFlashError(f"--resume: --{name.replace('_', '-')} {mine} differs from the run's {theirs}")
        # A resumed run is the same run: everything but its length, cadence and place comes from OUT.
        here = {k: getattr(s, k) for k in RESUMABLE_FIELDS}
        with reading_state(work):
            return TrainSettings(**{**saved, **here, "resume": True})
    with reading_state(work):
        step = saved_step(work)
    if step is not None:
        raise DFlashError(f"{out} already holds a training run at step {step}: pass --resume, or another --out")
    if out.exists() and any(p.name != ".train" for p in out.iterdir()):
        raise DFlashError(f"{out} exists and is not empty: choose another --out")
    return s


#: every integer setting's largest value, whatever its digit count (10**30 steps never return)
_MAX = {
    "steps": 10**9,
    "batch_size": 1 << 16,
    "anchors": 1 << 16,
    "prompt_len": 1 << 24,
    "gen_len": 1 << 24,
    "window_stride": 1 << 24,
    "samples": 1 << 30,
    "eval_prompts": 1 << 20,
    "eval_every": 10**9,
    "eval_tokens": 1 << 24,
    "save_every": 10**9,
    "regen_concurrency": 1 << 16,
    "block_size": 1024,
    "layers": 1024,
    "mask_token_id": 1 << 31,
    "conv_kernel_size": 1024,
    "conv_group_size": 1 << 20,
    "selector_rank": 1 << 20,
    "selector_top_k": 1 << 20,
    "seed": 2**63 - 1,
}


NAME_MAX = 255  # bytes in one path component (Linux, macOS)


def check_numbers(s: TrainSettings, world: int) -> None:
    """Every number of ``s`` in range for a run on ``world`` ranks; the two directories it writes
    named within the file system's limit, and neither already something else (a file, a FIFO)."""
    for flag, path in (("--out", s.out), ("--feature-cache", s.feature_cache)):  # before any work is done
        too_long = [part for part in Path(path or ".").parts if len(part.encode()) > NAME_MAX]
        if too_long:
            raise DFlashError(f"{flag} {str(path)[:80]}...: a name past the file system's {NAME_MAX} bytes")
        where = Path(path).expanduser() if path else None
        if where is not None and os.path.lexists(where) and not where.is_dir():
            raise DFlashError(f"{flag} {where}: exists and is not a directory; choose another path")
    _check_endpoint(s.regen_endpoint)
    for name, most in _MAX.items():
        v = getattr(s, name)
        if v is not None and not -most <= v <= most:
            raise DFlashError(f"--{name.replace('_', '-')} {v}: out of range (at most {most:,})")
    if not 0 < s.feature_shard_mb <= 1 << 20 or not 0 < s.lr < 1e3:
        raise DFlashError(f"--feature-shard-mb {s.feature_shard_mb} / --lr {s.lr}: out of range")
    if s.steps < 1 or s.batch_size < 1 or s.anchors < 1 or s.prompt_len < 2 or s.gen_len < 1:
        raise DFlashError("--steps, --batch-size, --anchors, --gen-len must be >= 1 and --prompt-len >= 2")
    if s.batch_size < world:
        raise DFlashError(
            f"--batch-size {s.batch_size} is the global batch: give at least one sequence to each of the {world} ranks"
        )
    if s.regen_concurrency < 1 or s.feature_shard_mb <= 0:
        raise DFlashError("--regen-concurrency must be >= 1 and the feature shard size > 0")


def _check_endpoint(url: str | None) -> None:
    """``--regen-endpoint``, when given, an http(s) URL with a host (its port a number in range)."""
    if url is None:
        return
    try:
        url.encode()
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port or 1) > 0
    except (UnicodeError, ValueError):  # a lone surrogate; a port that is not a number or out of range
        ok = False
    if not ok:
        raise DFlashError(f"--regen-endpoint {url[:80]!r}: not an http:// or https:// URL with a host")


def preflight(settings: TrainSettings, world: int) -> None:
    """The checks that need no target (OUT, the numbers, the data), for a launcher to make
    before it starts ``world`` ranks."""
    out = Path(settings.out).expanduser()
    s = prepare(settings, out, out / ".train")
    check_numbers(s, world)
    if regen.cached_set(s, out / ".train") is None:
        train_data.read_data(s.data)
    if s.eval_data is not None:
        train_data.read_data(s.eval_data, flag="--eval-data")
