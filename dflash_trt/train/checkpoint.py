"""Checkpoints of a training run: safetensors and JSON, nothing pickled, rank 0 the only writer.

``.train/state.safetensors`` holds the fp32 drafter weights (``model.*``), the AdamW moments
(``opt.<param index>.<name>``) and, in its metadata, the step, the optimiser's param groups
and the evaluation history: one file, renamed into place, is the whole resumable state, so a
run killed at any moment resumes from its last complete checkpoint. ``state.json`` is a
readable copy of the metadata. The state is not sharded (every rank holds the whole drafter),
so a run resumes on any number of ranks.

``OUT/config.json`` + ``OUT/model.safetensors`` (the z-lab drafter) and ``OUT/training.json``
(how it was trained: target, data, regeneration source, chat template and thinking setting,
features, ranks) are rewritten at every checkpoint.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from dflash_trt.errors import DFlashError
from dflash_trt.model import Drafter

METADATA_FILE = "training.json"


def write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    tmp.replace(path)


def save_state(work: Path, drafter: Drafter, opt: torch.optim.Optimizer, step: int, history: list) -> None:
    from safetensors.torch import save_file

    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in drafter.state_dict().items()}
    sd = opt.state_dict()
    for idx, st in sd["state"].items():
        for name, t in st.items():
            tensors[f"opt.{idx}.{name}"] = t.detach().cpu().reshape(-1).contiguous()
    meta = {"step": step, "param_groups": sd["param_groups"], "history": history}
    tmp = work / "state.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"state": json.dumps(meta)})
    tmp.replace(work / "state.safetensors")
    write_json(work / "state.json", meta)


def load_state(work: Path, drafter: Drafter, opt: torch.optim.Optimizer) -> tuple[int, list]:
    from safetensors import safe_open
    from safetensors.torch import load_file

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
    if tmp.exists():
        for f in tmp.iterdir():
            f.unlink()
    d = copy.deepcopy(drafter).to(getattr(torch, dtype))
    d.save(tmp)
    for name in ("config.json", "model.safetensors"):
        (tmp / name).replace(out / name)
    write_json(out / METADATA_FILE, metadata)
