"""Checkpoints of a training run: torch's distributed checkpoint in safetensors, nothing pickled.

``.train/state/`` is the resumable state, written by every rank with
``torch.distributed.checkpoint`` (``get_state_dict`` / ``set_state_dict`` from
``torch.distributed.checkpoint.state_dict``) through its safetensors storage
(``HuggingFaceStorageWriter(save_distributed=True)``): each rank writes the shards it holds
(``shard-<rank>-model-*.safetensors``, each tensor's offset in the safetensors metadata), and
reading maps the saved shards onto whatever the loading ranks hold, so a run saved by 2 fsdp
ranks resumes in 1 process, or on 4 ranks, or under ddp. It holds the fp32 drafter weights
(``model.<name>``) and the AdamW moments and step counts (``optim.state.<name>.<moment>``);
what is not a tensor (the step, the optimiser's param groups, the evaluation history) is JSON,
``state/train.json``. The folder is written as ``state.tmp/`` and renamed into place, so a
run killed at any moment resumes from its last complete checkpoint. ``state.json`` beside it
is a readable copy of ``train.json``. (Runs saved before by one process, as
``state.safetensors``, still resume in one process.)

``OUT/config.json`` + ``OUT/model.safetensors`` (the z-lab drafter) and ``OUT/training.json``
(how it was trained: target, data, regeneration source, chat template and thinking setting,
features, ranks) are rewritten at every checkpoint by rank 0, from the full weights gathered
from every rank (:func:`full_drafter`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import warnings
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from dflash_trt.errors import DFlashError, discard_on_error
from dflash_trt.model import Drafter
from dflash_trt.train.dist import Ranks

logger = logging.getLogger(__name__)

METADATA_FILE = "training.json"
STATE_DIR = "state"


def check_confined(out: Path) -> None:
    """Refuse an OUT whose ``.train/`` (what the run writes, replaces and removes) is, or holds, a
    symlink: the run would write or delete wherever it points. One line naming it."""
    work = out / ".train"
    links = [work] if work.is_symlink() else []
    if work.is_dir() and not links:
        for dirpath, dirnames, filenames in os.walk(work):
            links += [Path(dirpath) / n for n in dirnames + filenames if (Path(dirpath) / n).is_symlink()]
    if links:
        raise DFlashError(
            f"--out {out}: {links[0]} is a symlink; the run writes and removes files there, so it "
            "writes only inside --out: replace the link by a directory of its own"
        )


def write_json(path: Path, obj) -> None:
    """``obj`` as JSON at ``path``, renamed into place from a fresh file (a symlink at either name is
    replaced, never written through)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    with discard_on_error(tmp):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(obj, indent=2) + "\n")
        tmp.replace(path)


@contextlib.contextmanager
def _one_process_ok():
    """DCP warns that it works without a process group; here that is the plain one-process run."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is .*uninitialized")
        yield


def _tensors_only(osd: dict) -> dict:
    return {"state": osd["state"]}


def save_state(
    work: Path, module: nn.Module, opt: torch.optim.Optimizer, step: int, history: list, ranks: Ranks
) -> None:
    """Every rank writes its shards of the drafter and its moments; rank 0 renames the folder."""
    import torch.distributed.checkpoint as dcp  # start-up: torch
    from torch.distributed.checkpoint import HuggingFaceStorageWriter  # start-up: torch
    from torch.distributed.checkpoint.state_dict import get_state_dict  # start-up: torch

    msd, osd = get_state_dict(module, opt)
    tmp, final = work / (STATE_DIR + ".tmp"), work / STATE_DIR
    if ranks.main and tmp.exists():
        shutil.rmtree(tmp)
    ranks.barrier()
    with _one_process_ok(), discard_on_error(tmp):
        dcp.save(
            {"model": msd, "optim": _tensors_only(osd)},
            storage_writer=HuggingFaceStorageWriter(str(tmp), save_distributed=True),
            no_dist=not torch.distributed.is_initialized(),
        )
    ranks.barrier()
    if ranks.main:
        meta = {
            "step": step,
            "param_groups": osd["param_groups"],
            "history": history,
            "ranks": ranks.world,
            "parallel": ranks.parallel,
        }
        with discard_on_error(tmp):
            write_json(tmp / "train.json", meta)
        old = work / (STATE_DIR + ".old")
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
            final.replace(old)
        tmp.replace(final)
        shutil.rmtree(old, ignore_errors=True)
        write_json(work / "state.json", meta)
    ranks.barrier()


@contextlib.contextmanager
def reading_state(work: Path):
    """A saved run read for ``--resume``: any failure reading it (a truncated JSON, a damaged
    safetensors shard, torch's ``CheckpointException``, which derives from ``BaseException`` only)
    is one line naming the folder; Ctrl-C and ``SystemExit`` pass through."""
    try:
        yield
    except (DFlashError, KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - whatever the readers raise, the state on disk is damaged
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise DFlashError(
            f"{work}: the saved training state is damaged ({type(exc).__name__}: {first}); "
            "restore the folder, or start a fresh run with another --out"
        ) from None


def has_state(work: Path) -> bool:
    return (work / STATE_DIR / "train.json").exists() or (work / "state.safetensors").exists()


def load_state(work: Path, module: nn.Module, opt: torch.optim.Optimizer) -> tuple[int, list]:
    """Read the saved state into this rank's shards (any rank count, any engine); (step, history)."""
    import torch.distributed.checkpoint as dcp  # start-up: torch
    from torch.distributed.checkpoint import HuggingFaceStorageReader  # start-up: torch
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # start-up: torch

    folder = work / STATE_DIR
    if not (folder / "train.json").exists():
        return _load_legacy(work, module, opt)
    meta = json.loads((folder / "train.json").read_text())
    msd, osd = get_state_dict(module, opt)
    state = {"model": msd, "optim": _tensors_only(osd)}
    try:
        with _one_process_ok():
            dcp.load(
                state,
                storage_reader=HuggingFaceStorageReader(str(folder)),
                no_dist=not torch.distributed.is_initialized(),
            )
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - DCP's CheckpointException (a BaseException) holds every rank's
        logger.debug("loading the training state in %s failed", folder, exc_info=exc)  # the user's error, kept whole
        raise DFlashError(
            f"{folder}: the saved training state does not match this drafter ({str(exc).splitlines()[0][:200]})"
        ) from None
    set_state_dict(
        module,
        opt,
        model_state_dict=state["model"],
        optim_state_dict={"state": state["optim"]["state"], "param_groups": meta["param_groups"]},
    )
    return int(meta["step"]), list(meta.get("history", []))


def read_state(work: Path) -> dict[str, torch.Tensor]:
    """The whole saved state as flat full tensors (``model.<name>``, ``optim.state.<name>.<moment>``),
    gathered from every rank's shards: what tests and tools compare."""
    import torch.distributed.checkpoint as dcp  # start-up: torch
    from torch.distributed.checkpoint import HuggingFaceStorageReader  # start-up: torch

    reader = HuggingFaceStorageReader(str(work / STATE_DIR))
    meta = reader.read_metadata()
    out = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.state_dict_metadata.items()}
    with _one_process_ok():
        dcp.load(out, storage_reader=reader, no_dist=True)
    return out


def _load_legacy(work: Path, drafter: nn.Module, opt: torch.optim.Optimizer) -> tuple[int, list]:
    """``state.safetensors`` of a run saved by one process before the distributed checkpoint."""
    path = work / "state.safetensors"
    with safe_open(str(path), "pt") as f:
        embedded = (f.metadata() or {}).get("state")
    meta = json.loads(embedded) if embedded else json.loads((work / "state.json").read_text())
    tensors = load_file(str(path))
    drafter.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    state: dict = {}
    for k, v in tensors.items():
        if k.startswith("opt."):
            _, idx, name = k.split(".", 2)
            state.setdefault(int(idx), {})[name] = v.reshape(()) if name == "step" else v
    params = [p for group in opt.param_groups for p in group["params"]]
    for idx, st in state.items():
        if idx >= len(params):
            raise DFlashError(f"{work}: the saved optimizer state does not match this drafter")
        for name in ("exp_avg", "exp_avg_sq"):
            if name in st:
                st[name] = st[name].view(params[idx].shape)
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    return int(meta["step"]), list(meta.get("history", []))


def saved_step(work: Path) -> int | None:
    """The step of the run saved in ``work`` (None when there is none)."""
    if not (work / "state.json").exists():
        return None
    return int(json.loads((work / "state.json").read_text())["step"])


def write_drafter(drafter: Drafter, out: Path, dtype: str, metadata: dict) -> None:
    """z-lab config.json + model.safetensors, and training.json, into OUT, each renamed into place."""
    tmp = out / ".train" / "export.tmp"
    if tmp.is_symlink():
        tmp.unlink()
    elif tmp.exists():
        shutil.rmtree(tmp)
    d = drafter.to(getattr(torch, dtype))
    with discard_on_error(tmp):
        d.save(tmp)
        for name in ("config.json", "model.safetensors"):
            (tmp / name).replace(out / name)
    write_json(out / METADATA_FILE, metadata)


def full_drafter(module: nn.Module, like: Drafter, ranks: Ranks, everywhere: bool = False) -> Drafter | None:
    """A plain copy of the trained drafter, its full weights gathered from every rank's shards
    (a collective: every rank calls it). On rank 0 only (None elsewhere) unless ``everywhere``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict  # start-up: torch

    offload = ranks.world > 1 and not everywhere
    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=offload))
    if offload and not ranks.main:
        return None
    prefix = "drafter."
    state = {k.removeprefix(prefix): v.detach().clone() for k, v in state.items()}
    d = type(like).from_state(like.cfg, state)
    return d.to(ranks.device)
