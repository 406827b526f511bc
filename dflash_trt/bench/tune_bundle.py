"""What ``dflash-trt tune`` reads of a bundle and writes back into it.

Invariant: a bundle tune cannot tune is refused in one line before anything is measured
(:func:`read`: no speculative config, no plan, drafting gated off); every text tune writes is
validated before it is written (``trtllm/config.yaml`` against the release's schema, the manifest
against ``ingest.Manifest``, with the sha256 of each new file and ``.prev`` copy, so ``verify``
still holds), and all of them go in as one journaled swap (:func:`commit`, what ``build --force``
uses), the previous files kept as ``NAME.prev``: a kill leaves the old bundle or the new one,
never half of each. How the lengths are chosen is :mod:`~dflash_trt.bench.tune`'s.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from dflash_trt import deploy, ingest
from dflash_trt import plan as planner
from dflash_trt.errors import DFlashError


@dataclass
class Tunable:
    """What tune reads of a bundle."""

    root: Path
    manifest: ingest.Manifest
    config: dict  # trtllm/config.yaml
    max_batch_size: int
    max_draft_len: int
    release: str

    @property
    def name(self) -> str:
        return self.manifest.name or self.root.name


def read(bundle: Path) -> Tunable:
    """The bundle as tune reads it, or one line saying why it cannot be tuned."""
    b = ingest.check_bundle(bundle)
    try:
        cfg = yaml.safe_load(b.trtllm_config.read_text()) or {}
    except yaml.YAMLError as exc:
        raise DFlashError(f"{b.trtllm_config}: invalid YAML ({exc})") from None
    gate = deploy.speculation_gate(cfg)
    if gate:
        raise DFlashError(f"{b.trtllm_config}: {gate}")
    spec = cfg.get("speculative_config") or {}
    if not spec.get("max_draft_len"):
        raise DFlashError(f"{b.trtllm_config}: no speculative_config.max_draft_len; nothing to tune")
    if b.built.plan is None:
        raise DFlashError(f"{b.root}: the manifest has no plan; rebuild the bundle with 'dflash-trt build'")
    release = b.built.plan.trtllm_release
    return Tunable(b.root, b.built, cfg, int(cfg.get("max_batch_size") or 8), int(spec["max_draft_len"]), release)


def arms_files(t: Tunable, rows: list[dict], source: str) -> dict[Path, str]:
    """The manifest with ``plan.arms`` (which arm won where, measured) set, by path."""
    manifest = t.manifest.model_copy(deep=True)
    assert manifest.plan is not None  # read() refuses a manifest without one
    manifest.plan.arms = ingest.Arms(
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), source=source, measured=rows
    )
    m = manifest.to_json()
    if m.get("files") is not None:  # the .prev copy, so verify still holds
        rel = ingest.Layout.MANIFEST
        m["files"] = {**m["files"], f"{rel}.prev": hashlib.sha256((t.root / rel).read_bytes()).hexdigest()}
    ingest.Manifest.model_validate(m)
    return {t.root / ingest.Layout.MANIFEST: json.dumps(m, indent=2) + "\n"}


def new_files(
    t: Tunable, max_draft_len: int, sched: dict[int, int], drafted: list[int], tuned: dict
) -> dict[Path, str]:
    """The new ``config.yaml`` and ``manifest.json`` texts (validated), by path."""
    cfg = json.loads(json.dumps(t.config))
    spec = cfg["speculative_config"]
    spec.pop("max_concurrency", None)
    spec.update(max_draft_len=max_draft_len, draft_len_schedule=dict(sched))
    text = deploy.trtllm_yaml(deploy.validate_trtllm_config(cfg, t.release), t.release)
    manifest = t.manifest.model_copy(deep=True)
    assert manifest.plan is not None  # read() refuses a manifest without one
    runs = [
        ingest.DraftRun(batch_from=r.first, batch_to=r.last, draft_len=r.draft_len)
        for r in planner.schedule_runs(drafted)
    ]
    plan = manifest.plan  # each assignment validated (ingest.Plan)
    plan.max_draft_len, plan.schedule, plan.max_concurrency = max_draft_len, "draft_len_schedule", None
    plan.draft_len_schedule, plan.draft_lengths, plan.tuned = dict(sched), runs, ingest.Tuned.model_validate(tuned)
    m = manifest.to_json()
    if m.get("files") is not None:  # the new config and the two .prev copies, so verify still holds
        L = ingest.Layout
        m["files"] = {
            **m["files"],
            L.TRTLLM_CONFIG: hashlib.sha256(text.encode()).hexdigest(),
            **{
                f"{rel}.prev": hashlib.sha256((t.root / rel).read_bytes()).hexdigest()
                for rel in (L.TRTLLM_CONFIG, L.MANIFEST)
            },
        }
    ingest.Manifest.model_validate(m)
    return {t.root / ingest.Layout.TRTLLM_CONFIG: text, t.root / ingest.Layout.MANIFEST: json.dumps(m, indent=2) + "\n"}


def commit(root: Path, files: dict[Path, str], warnings: list[str] | None = None) -> list[Path]:
    """Write tune's files into bundle ``root`` as one journaled swap (``deploy.replace_files``), the
    previous ones kept as ``NAME.prev``. Call it holding the bundle's lock. Returns the ``.prev`` paths
    (what the OS refused to remove afterwards is appended to ``warnings``)."""
    return deploy.replace_files(root, files, "tune's file", warnings)


def tuned_record(
    measured: dict[int, list[dict]], wins: dict[int, int], calibration: str, arms: list[dict] | None = None
) -> dict:
    """``plan.tuned``: when, the winning length per concurrency, the refitted calibration, the arms
    and per draft length what each level measured."""
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "winners": wins,
        "calibration": calibration,
        **({"arms": arms} if arms else {}),
        "measured": {
            str(L): [
                {
                    "concurrency": lv["concurrency"],
                    "output_tokens_per_second": lv["output_tokens_per_second"],
                    "acceptance_length": lv["acceptance_length"],
                    "output_tokens_per_second_spread": (lv.get("spread") or {}).get("output_tokens_per_second"),
                    "tpot_ms": lv.get("tpot_ms"),
                }
                for lv in levels
            ]
            for L, levels in measured.items()
        },
    }
