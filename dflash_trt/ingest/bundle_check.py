"""The bundle checks itself where it is used: its manifest against its files, and what is loaded.

Invariants:

- **confined** (:func:`check_paths`, run by ``open_bundle`` on every bundle with a manifest): every
  path the manifest names (``reference_runtime``, ``outputs``) is a plain relative name inside the
  bundle, and no symlink in the bundle leads outside it; nothing outside the bundle is loaded.
- **the manifest is checked against its files, not sealed with its own digest**
  (:func:`check_fields`, ``dflash-trt verify``): each setting the manifest records that
  ``trtllm/config.yaml``, ``trtllm/serve.sh`` or the bundle's own files also say must be equal there.
- **what is loaded is what was built** (:class:`LoadCheck`, ``runtime.load_bundle``): the files of
  every directory the runtime reads are hashed *while* the loader reads them (a thread beside the
  load, over the same page cache: a large model pays no second pass) and compared with the
  manifest's ``files``; a file changed, missing or added refuses the bundle in one line before it
  serves anything. Format-2 bundles (no ``files``) are loaded unchecked, as before.
"""

from __future__ import annotations

import os
import re
import shlex
import threading
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from dflash_trt.errors import CheckpointError
from dflash_trt.ingest.bundle import BUILD_SECTIONS, REQUIRED_FILES, Bundle, Layout, read_manifest
from dflash_trt.ingest.chat import serving_chat
from dflash_trt.ingest.drafter import read_drafter
from dflash_trt.ingest.files import sha256_file


def _plain(rel: str) -> bool:
    p = PurePosixPath(rel)
    return (
        bool(rel) and not p.is_absolute() and not any(part in ("", ".", "..") for part in p.parts) and "\\" not in rel
    )


def named_paths(bundle: Bundle) -> dict[str, str]:
    """The manifest's fields that name a path inside the bundle (field -> relative path)."""
    m = bundle.built
    out = {f"reference_runtime.{k}": getattr(m.reference_runtime, k) for k in ("target", "drafter")}
    if m.outputs is not None:
        out.update({f"outputs.{k}": v for k, v in m.outputs.model_dump().items() if isinstance(v, str)})
    return out


def check_paths(bundle: Bundle) -> None:
    """Refuse, in one line, a manifest path outside the bundle or a symlink in it leading outside."""
    root = bundle.root.resolve()
    for dirpath, dirnames, filenames in os.walk(bundle.root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            if p.is_symlink() and root not in p.resolve().parents:
                raise CheckpointError(
                    f"{p}: a symlink leading outside the bundle ({p.resolve()}); a bundle holds "
                    "only its own files: rebuild it with 'dflash-trt build'"
                )
    for field, rel in named_paths(bundle).items():
        if not _plain(rel) or root not in (bundle.root / rel).resolve().parents:
            raise CheckpointError(
                f"{bundle.manifest_path}: {field} {rel!r} is not a path inside the bundle; "
                "rebuild the bundle with 'dflash-trt build'"
            )


def serve_sh_settings(text: str) -> dict[str, str]:
    """What ``serve.sh`` says: the release it checks for, the GPU it checks, and trtllm-serve's flags."""
    out = {}
    if m := re.search(r"^NEED_TRTLLM=(\S+)$", text, re.M):
        out["release"] = shlex.split(m.group(1))[0]
    for key in ("want_sm", "want_gb", "want_n"):
        if m := re.search(rf"-v {key}=(\S+)", text):
            out[key] = m.group(1)
    if m := re.search(r"^exec trtllm-serve (.*)$", text, re.M):
        words = shlex.split(m.group(1))
        out.update({w[2:]: v for w, v in zip(words, words[1:], strict=False) if w.startswith("--")})
    return out


def check_fields(bundle: Bundle, config: dict) -> list[str]:
    """Where the manifest's own fields differ from what ``trtllm/config.yaml`` (``config``),
    ``trtllm/serve.sh`` and the bundle's files say (one line each; empty: all agree)."""
    m, plan = bundle.built, bundle.built.plan
    sh = serve_sh_settings(bundle.serve_sh.read_text()) if bundle.serve_sh.is_file() else {}
    spec = config.get("speculative_config") or {}
    want: dict[str, tuple[object, object, str]] = {}  # field -> (manifest's, the file's, which file)
    if m.trtllm is not None:
        want["trtllm.release"] = (m.trtllm.release, sh.get("release"), Layout.SERVE_SH)
        if plan is not None:
            want["plan.trtllm_release"] = (plan.trtllm_release, m.trtllm.release, "manifest trtllm.release")
    if m.gpu is not None and "want_sm" in sh:
        want["gpu.sm"] = (str(m.gpu.sm), sh["want_sm"], Layout.SERVE_SH)
        want["gpu.memory_gb"] = (f"{m.gpu.memory_gb:g}", sh.get("want_gb"), Layout.SERVE_SH)
    want["serve.tp_size"] = (m.serve.tp_size, config.get("tensor_parallel_size", 1), Layout.TRTLLM_CONFIG)
    if m.serve.max_seq_len is not None:
        want["serve.max_seq_len"] = (m.serve.max_seq_len, config.get("max_seq_len"), Layout.TRTLLM_CONFIG)
    for flag, key in (
        ("tp_size", "tensor_parallel_size"),
        ("max_batch_size", "max_batch_size"),
        ("max_num_tokens", "max_num_tokens"),
        ("max_seq_len", "max_seq_len"),
    ):
        if flag in sh and key in config:
            want[f"serve.sh --{flag}"] = (str(config[key]), sh[flag], Layout.SERVE_SH)
    if m.precision is not None and plan is not None:
        want["precision.kv_cache"] = (m.precision.kv_cache, plan.kv_cache, "plan")
        want["precision.weights"] = (m.precision.weights, plan.precision, "plan")
    if m.drafter is not None and spec.get("target_layer_ids") is not None:
        want["drafter.target_layer_ids"] = (
            sorted(m.drafter.target_layer_ids),
            sorted(spec["target_layer_ids"]),
            Layout.TRTLLM_CONFIG,
        )
    if m.serve.chat_template_sha256 is not None:
        got = serving_chat(bundle.root / m.reference_runtime.target, None)["chat_template_sha256"]
        want["serve.chat_template_sha256"] = (m.serve.chat_template_sha256, got, "the target's chat template")
    return [
        f"manifest {k} is {mine!r}, {where} says {theirs!r}"
        for k, (mine, theirs, where) in want.items()
        if mine != theirs
    ]


class LoadCheck:
    """Hash the files of ``dirs`` (and ``files``) of a bundle while the caller loads them, and on
    exit refuse, in one line, any that differs from the manifest's ``files``::

        with LoadCheck(bundle, ["target", "drafter"], ["trtllm/config.yaml"]):
            ...load...
    """

    def __init__(self, bundle: Bundle, dirs: list[str], files: Sequence[str] = ()):
        self.bundle, self.recorded = bundle, bundle.built.files
        self.dirs, self.files = [d.rstrip("/") for d in dirs], list(files)
        self.found: dict[str, str] = {}
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._hash, name="bundle-hash", daemon=True)

    def _wanted(self) -> list[str]:
        rels = set(self.files)
        for d in self.dirs:
            base = self.bundle.root / d
            if not base.is_dir():
                continue
            rels |= {
                p.relative_to(self.bundle.root).as_posix()
                for p in base.rglob("*")
                if p.is_file() and not any(s.startswith(".") for s in p.relative_to(base).parts)
            }
        return sorted(rels)

    def _hash(self) -> None:
        try:
            for rel in self._wanted():
                self.found[rel] = sha256_file(self.bundle.root / rel)
        except BaseException as exc:  # noqa: BLE001 - reported on the caller's thread
            self.error = exc

    def __enter__(self) -> LoadCheck:
        if self.recorded is not None:
            self.thread.start()
        return self

    def problems(self) -> list[str]:
        rec = self.recorded or {}
        scope = [r for r in rec if r in self.files or any(r.startswith(f"{d}/") for d in self.dirs)]
        out = [
            f"{r}: sha256 differs from the manifest's"
            for r in sorted(scope)
            if r in self.found and self.found[r] != rec[r]
        ]
        out += [f"{r}: missing" for r in sorted(set(scope) - set(self.found))]
        out += [f"{r}: not in the manifest (added after the build)" for r in sorted(set(self.found) - set(rec))]
        return out

    def __exit__(self, kind, exc, tb) -> None:
        if self.recorded is None or (kind is not None and not issubclass(kind, Exception)):
            return  # Ctrl-C: not held up by the hashing (a daemon thread)
        self.thread.join()
        if self.error is not None and not isinstance(self.error, OSError | CheckpointError):
            raise self.error
        problems = self.problems() if self.error is None else [str(self.error)]
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise CheckpointError(
                f"{self.bundle.root}: {problems[0]}{more}: what would be loaded is not what was "
                f"built; 'dflash-trt verify {self.bundle.root}' lists every difference; rebuild "
                "the bundle with 'dflash-trt build ... --force'"
            ) from exc


def open_bundle(path: str | Path, require_manifest: bool = True) -> Bundle:
    """A bundle directory and its manifest. ``require_manifest=False`` also opens a directory
    without one (``serve`` of a hand-made TensorRT-LLM directory); a manifest present is
    always read and checked, its paths confined to the bundle (:func:`check_paths`)."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"{path}: no such bundle directory (build one with 'dflash-trt build -o DIR')")
    if not require_manifest and not (root / Layout.MANIFEST).exists():
        return Bundle(root)
    bundle = Bundle(root, read_manifest(root))
    check_paths(bundle)  # nothing the manifest names, and no link, leads outside the bundle
    return bundle


def check_bundle(path: str | Path) -> Bundle:
    """What can be checked of a bundle without TensorRT-LLM's schema: every file of the
    layout, a manifest of this format with every section ``build`` writes, an executable
    ``serve.sh``, a drafter that reads. (``build.check_bundle`` adds the TensorRT-LLM config
    and the quantized tensors.)"""
    root = Path(path)
    for rel in REQUIRED_FILES:
        if not (root / rel).is_file():
            raise CheckpointError(f"{root}: bundle lacks {rel}")
    bundle = open_bundle(root)
    missing = [k for k in BUILD_SECTIONS if k not in bundle.built.model_fields_set]
    if missing:
        raise CheckpointError(f"{root}: manifest lacks {missing[0]!r}")
    if not os.access(bundle.serve_sh, os.X_OK):
        raise CheckpointError(f"{root}: {Layout.SERVE_SH} is not executable")
    read_drafter(bundle.drafter)
    return bundle
