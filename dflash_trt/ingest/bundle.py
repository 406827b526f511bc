"""The bundle ``dflash-trt build`` writes: its layout, its typed manifest, and its check.

Layout, relative to the bundle's root::

    manifest.json        what was built from what (:class:`Manifest`): inputs (ids, revisions,
                         sha256), tool versions, the TensorRT-LLM release, GPU, precision, the
                         plan, what was changed in the drafter, timings
    target/              the target checkpoint (as shipped, or exported by ModelOpt)
    drafter/             the drafter in z-lab form, BF16 (what TensorRT-LLM's DFlash loader reads)
    trtllm/config.yaml   the TensorRT-LLM LLM-API config
    trtllm/serve.sh      the ``trtllm-serve`` launch script
    onnx/  engines/      the standalone TensorRT path (``graphs: true`` recipes, ``build --graphs``, only)

``build`` writes the manifest with :func:`write_manifest`; ``runtime``, ``serve`` and ``bench``
read it with :func:`open_bundle` / :func:`read_manifest`. Both go through :class:`Manifest`,
so its fields are the manifest's schema. The format version is :data:`BUNDLE_FORMAT`, checked
in :func:`check_format` alone: a manifest of a version not in :data:`READABLE_FORMATS` is refused
in one line that says to rebuild. A missing or malformed manifest is one line too
(``CheckpointError``). From format 3 the manifest's ``files`` records the sha256 of every file the
bundle holds but the manifest itself (:func:`bundle_hashes`); :func:`check_files` compares them
with what is on disk (``dflash-trt verify``).

An older format's key (:data:`OLD_KEYS`: ``engine``, ``graphs`` from format 4) is read as today's by
:class:`Manifest` itself and written back as its own format spells it (``tune`` keeps the format).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dflash_trt.errors import CheckpointError
from dflash_trt.ingest.files import sha256_files
from dflash_trt.ingest.plan_record import Plan
from dflash_trt.model import graph_kinds

# Bump when a bundle written before can no longer be served or run as it is (the readers
# then refuse it and say to rebuild). 2: draft_len_schedule keys are upper bounds, as
# TensorRT-LLM's one-model DFlash path reads them (format 1 wrote them inverted); the
# targeted TensorRT-LLM release is recorded; the drafter is BF16 with ascending layers.
# 3: ``files`` records the sha256 of every file the bundle holds (``dflash-trt verify``). A
# format-2 bundle still serves and runs as it is, so the readers accept it (READABLE_FORMATS);
# only ``verify``, which needs the hashes, tells it to rebuild (HASHED_FORMATS).
# 4: the standalone path's section is ``graphs`` (was ``engine``: OLD_KEYS); a format-3 bundle still verifies.
BUNDLE_FORMAT = "dflash-trt-bundle/4"
READABLE_FORMATS = (BUNDLE_FORMAT, "dflash-trt-bundle/3", "dflash-trt-bundle/2")
HASHED_FORMATS = (BUNDLE_FORMAT, "dflash-trt-bundle/3")  # the formats whose ``files`` verify checks
# {format: {the key it wrote: today's field}}, for every readable format that spelled a key otherwise
OLD_KEYS = {fmt: {"engine": "graphs"} for fmt in ("dflash-trt-bundle/3", "dflash-trt-bundle/2")}
WHY_REBUILD = {
    "dflash-trt-bundle/1": "its draft_len_schedule is read inverted by TensorRT-LLM",
    "dflash-trt-bundle/2": "it records no per-file hashes",
}


class Layout:
    """Where each part of a bundle lives, relative to its root (POSIX paths)."""

    MANIFEST = "manifest.json"
    TARGET = "target"
    DRAFTER = "drafter"
    TRTLLM = "trtllm"
    TRTLLM_CONFIG = "trtllm/config.yaml"
    SERVE_SH = "trtllm/serve.sh"
    ONNX = "onnx"
    ENGINES = "engines"
    SWAP_JOURNAL = ".dflash-trt.swap.json"  # present only while a swap is under way or was killed (deploy.swap)


# Files every built bundle has, and the manifest sections `build` always writes.
REQUIRED_FILES = (
    Layout.MANIFEST,
    f"{Layout.TARGET}/config.json",
    f"{Layout.DRAFTER}/config.json",
    Layout.TRTLLM_CONFIG,
    Layout.SERVE_SH,
)
BUILD_SECTIONS = ("inputs", "tools", "trtllm", "gpu", "precision", "plan", "drafter", "timings")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Input(_Section):
    """One input checkpoint: the reference the recipe named, where it was, what it held."""

    id: str
    revision: str | None = None
    path: str
    sha256: dict[str, str]  # relative POSIX path -> hex digest, every file


class Calibration(_Section):
    path: str
    sha256: str | None = None  # None: the path was not a file


class Inputs(_Section):
    target: Input
    drafter: Input
    calibration: Calibration | None = None


class GpuInfo(_Section):
    """The GPU the bundle was planned for (``build.hardware``'s catalog entry) and how many."""

    name: str
    sm: int
    memory_gb: int | float
    count: int


class Precision(_Section):
    weights: str  # bf16 | fp8 | nvfp4 | mxfp4 (effective, not requested)
    kv_cache: str
    quantized_by: str | None = None  # "nvidia-modelopt" | "as shipped" | None
    quantization: dict[str, Any] | None = None
    verified: dict[str, Any] | None = None


class TrtllmInfo(_Section):
    """The TensorRT-LLM release the bundle was built for, and its container image."""

    release: str
    image: str | None = None


class DrafterInfo(_Section):
    """How the bundle's drafter differs from the input drafter (``notes``: one line per change)."""

    dtype: str
    source_dtype: str
    target_layer_ids: list[int]
    source_target_layer_ids: list[int]
    block_size: int
    notes: list[str] = Field(default_factory=list)


class ReferenceRuntime(_Section):
    """What the reference runtime loads: directories relative to the root, and whether the
    target is a ModelOpt export to dequantize on load."""

    target: str = Layout.TARGET
    drafter: str = Layout.DRAFTER
    dequantize: bool = False
    source_target: str | None = None


class Outputs(_Section):
    target: str = Layout.TARGET
    drafter: str = Layout.DRAFTER
    trtllm_config: str = Layout.TRTLLM_CONFIG
    serve: str = Layout.SERVE_SH
    mtp_config: str | None = None  # trtllm/config.mtp.yaml: the target's own MTP arm, where it has one
    onnx: str | None = None
    engines: str | None = None


class ServeInfo(_Section):
    """What ``dflash-trt serve`` reads: the planned parallelism (multi-node launch files must
    match it) and the planned context length (the embedded server advertises it)."""

    tp_size: int | None = None
    pp_size: int | None = None
    gpus_per_node: int | None = None
    max_seq_len: int | None = None
    # The chat template the target serves with (its sha256, whether it has a thinking switch),
    # the switch the deployment sets (None: the template's default), and the chat settings the
    # drafter was trained with where its training.json says (ingest.chat).
    chat_template_sha256: str | None = None
    thinking_switch: bool | None = None
    enable_thinking: bool | None = None
    drafter_chat: dict | None = None


class EngineProfile(_Section):
    """The shapes the standalone graphs are run at and the TensorRT engines were built for (each
    dynamic axis's optimisation-profile maximum; ``build.export.DYNAMIC_AXES`` names which axis is
    which). The runtimes that run ``onnx/`` or ``engines/`` refuse a request outside them."""

    max_batch: int = Field(ge=1, description="Rows in one call (target, drafter, embedding).")
    max_tokens: int = Field(
        ge=1, description="Tokens per row in one target forward: a prompt's prefill, or the verify block."
    )
    max_seq_len: int = Field(ge=1, description="Target KV-cache columns plus the forward's own tokens.")
    block_size: int = Field(ge=1, description="The drafter block B the drafter graph was exported for.")
    page_size: int = Field(ge=1, description="Drafter context-cache slots per page (a custom-op attribute).")
    max_pages: int = Field(ge=1, description="Pages in the drafter's cache pool, all rows together.")
    max_pages_per_seq: int = Field(ge=1, description="Width of the drafter's page table.")


class GraphsInfo(_Section):
    """The standalone TensorRT path of a bundle built with ``--graphs``: the graphs exported into
    ``onnx/``, their parity with PyTorch, whether ``engines/`` was built, and the profile (bundles
    written before the profile was recorded have none; the graph runtimes then refuse them).
    Formats 2 and 3 wrote this section as ``engine``."""

    onnx: list[str]
    drafter_graph: str = Field(
        "dflash",
        description="drafter.onnx's I/O, the graph kind of the drafter family's export round "
        "(``model.graph_kinds``): dflash (export/onnx_graphs.py: logits out) or dflash2 "
        "(export/onnx_dflash2.py: anchor, uniforms, temperature in; tokens, q, candidates out).",
    )
    drafter_onnx_max_error: dict[str, float]
    target_onnx_max_error: dict[str, float] | None = None
    engines_built: bool
    engines_reason: str | None = None
    profile: EngineProfile | None = None

    @field_validator("drafter_graph")
    @classmethod
    def _known_graph(cls, kind: str) -> str:
        if kind not in graph_kinds():
            raise ValueError(f"unknown drafter graph {kind!r}; known: {', '.join(sorted(graph_kinds()))}")
        return kind


class Manifest(_Section):
    """``manifest.json``. Written as given (unset fields left out), so a bundle's manifest
    reads back field for field; ``format`` is always written."""

    format: str = BUNDLE_FORMAT
    name: str | None = None
    created: str | None = None
    recipe: dict[str, Any] | None = None  # kept as stored; plan.BundleManifest types it (a Recipe)
    recipe_source: str | None = None
    inputs: Inputs | None = None
    tools: dict[str, str | None] | None = None
    trtllm: TrtllmInfo | None = None
    gpu: GpuInfo | None = None
    precision: Precision | None = None
    plan: Plan | None = None
    drafter: DrafterInfo | None = None
    reference_runtime: ReferenceRuntime = Field(default_factory=ReferenceRuntime)
    outputs: Outputs | None = None
    serve: ServeInfo = Field(default_factory=ServeInfo)
    warnings: list[str] = Field(default_factory=list)
    graphs: GraphsInfo | None = None  # formats 2 and 3: ``engine`` (OLD_KEYS)
    timings: dict[str, float] | None = None
    # relative POSIX path -> sha256 of every file in the bundle but manifest.json (format 3 on)
    files: dict[str, str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _read_old_keys(cls, data: Any) -> Any:
        """An older format's keys (:data:`OLD_KEYS`) as today's; one spelled both ways is left to refuse."""
        renamed = OLD_KEYS.get(str(data.get("format"))) if isinstance(data, dict) else None
        if not renamed or any(new in data for new in renamed.values()):
            return data
        return {renamed.get(k, k): v for k, v in data.items()}

    def model_post_init(self, _context: Any) -> None:
        self.__pydantic_fields_set__.add("format")

    def to_json(self) -> dict:
        """The JSON object written to ``manifest.json``, keys spelled as its ``format`` spells them."""
        data = self.model_dump(mode="json", exclude_unset=True)
        old = {new: k for k, new in OLD_KEYS.get(self.format, {}).items()}
        return {old.get(k, k): v for k, v in data.items()} if old else data


@dataclass(frozen=True)
class Bundle:
    """A bundle directory: where each part lives, and its manifest once read (None: not read,
    or a directory without one)."""

    root: Path
    manifest: Manifest | None = None

    @property
    def name(self) -> str:
        return (self.manifest.name if self.manifest else None) or self.root.name

    @property
    def serve(self) -> ServeInfo:
        return self.manifest.serve if self.manifest else ServeInfo()

    @property
    def manifest_path(self) -> Path:
        return self.root / Layout.MANIFEST

    @property
    def built(self) -> Manifest:
        """The manifest of a bundle that has one; a one-line CheckpointError for a directory without."""
        if self.manifest is None:
            raise CheckpointError(
                f"{self.root}: not a dflash-trt bundle (no {Layout.MANIFEST}); build one with 'dflash-trt build'"
            )
        return self.manifest

    @property
    def target(self) -> Path:
        return self.root / Layout.TARGET

    @property
    def drafter(self) -> Path:
        return self.root / Layout.DRAFTER

    @property
    def trtllm(self) -> Path:
        return self.root / Layout.TRTLLM

    @property
    def trtllm_config(self) -> Path:
        return self.root / Layout.TRTLLM_CONFIG

    @property
    def serve_sh(self) -> Path:
        return self.root / Layout.SERVE_SH

    @property
    def onnx(self) -> Path:
        return self.root / Layout.ONNX

    @property
    def engines(self) -> Path:
        return self.root / Layout.ENGINES


def check_format(where: str | Path, fmt: object, accept: tuple[str, ...] = READABLE_FORMATS) -> None:
    """The one version check: refuse a manifest of a format not in ``accept`` (the formats the
    readers serve and run; ``verify`` accepts only :data:`HASHED_FORMATS`)."""
    if not isinstance(fmt, str) or fmt not in accept:
        why = f" ({WHY_REBUILD[fmt]})" if isinstance(fmt, str) and fmt in WHY_REBUILD else ""
        raise CheckpointError(
            f"{where}: bundle format {fmt!r}{why}, this dflash-trt reads {accept[0]!r}; "
            "rebuild the bundle with 'dflash-trt build'"
        )


def bundle_hashes(root: str | Path) -> dict[str, str]:
    """sha256 of every file under ``root`` but the manifest (what format 3 records as ``files``)."""
    return {k: v for k, v in sha256_files(root).items() if k != Layout.MANIFEST}


def check_files(bundle: Bundle) -> list[str]:
    """What on disk differs from the manifest's ``files``: one line per file changed, missing or
    added (empty: every file is as built). The manifest must be of :data:`HASHED_FORMATS`."""
    check_format(bundle.manifest_path, bundle.manifest.format if bundle.manifest else None, HASHED_FORMATS)
    recorded = bundle.built.files
    if recorded is None:
        raise CheckpointError(
            f"{bundle.manifest_path}: records no file hashes; rebuild the bundle with 'dflash-trt build'"
        )
    found = bundle_hashes(bundle.root)
    out = [
        f"{rel}: sha256 differs from the manifest's"
        for rel in sorted(recorded)
        if rel in found and found[rel] != recorded[rel]
    ]
    out += [f"{rel}: missing" for rel in sorted(set(recorded) - set(found))]
    out += [f"{rel}: not in the manifest (added after the build)" for rel in sorted(set(found) - set(recorded))]
    return out


def read_manifest(root: str | Path) -> Manifest:
    """``root/manifest.json``, its format checked, then validated field by field."""
    path = Path(root) / Layout.MANIFEST
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        if os.path.lexists(Path(root) / Layout.SWAP_JOURNAL):
            raise CheckpointError(
                f"{root}: a swap of this bundle was interrupted (killed); run the same "
                "'dflash-trt build --force' or 'dflash-trt tune' again to finish it"
            ) from None
        raise CheckpointError(
            f"{root}: no {Layout.MANIFEST}; is this a dflash-trt bundle (dflash-trt build -o DIR)?"
        ) from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: invalid JSON ({exc.msg} at line {exc.lineno})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    check_format(path, raw.get("format"))
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise CheckpointError(
            f"{path}: {loc}: {first['msg']}{more}; rebuild the bundle with 'dflash-trt build'"
        ) from None


def write_manifest(root: str | Path, manifest: Manifest) -> dict:
    """Write ``root/manifest.json``; returns the JSON object written."""
    data = manifest.to_json()
    (Path(root) / Layout.MANIFEST).write_text(json.dumps(data, indent=2) + "\n")
    return data
