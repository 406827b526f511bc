"""Drafter families behind one seam: a family is a class with override hooks, dispatched once.

A drafter *family* (DFlash, DFlash2, ...) is everything that differs between drafter
architectures built on the DFlash backbone (context fusion, KV injection, one block forward).
vLLM puts a family on a proposer subclass (``DFlashProposer(SpecDecodeBaseProposer)`` with
``@override``) and TensorRT-LLM on a worker subclass (``DSparkWorker(DFlashWorker)``); here:

* **This layer** (``model``, the lowest that needs it) holds :class:`DrafterFamily`: the
  family's declarative traits (``name``, the published ``architecture``, the ``fields`` its
  ``dflash_config`` adds, the drafter ``graph`` kind its export round writes) and its
  model-level hooks: recognising its checkpoint (:meth:`~DrafterFamily.recognises`), checking
  its config (:meth:`~DrafterFamily.check_config`, :meth:`~DrafterFamily.check_checkpoint`), its
  published tensor names and shapes (:meth:`~DrafterFamily.tensor_name`,
  :meth:`~DrafterFamily.expected_shapes`), its z-lab form (:meth:`~DrafterFamily.zlab_form`),
  its module class (:meth:`~DrafterFamily.module_class`), and how it fits a target
  (:meth:`~DrafterFamily.pair_check`). The base class *is* DFlash; a family subclasses it (or
  another family) and overrides what differs.
* **The one dispatch**: :func:`register` puts a family in the registry; :func:`family_of` reads a
  ``DrafterConfig``'s family (its ``family`` name, set once when the config is validated, from
  the fields set when not given) and :func:`recognise` a checkpoint's (``config.json`` and tensor
  names; the last-registered family that recognises it wins, so a subclass is asked before its
  parent). No stage asks "is this DFlash2?".
* **Each higher stage** keeps a small hook class per family, registered with that layer's own
  ``register_family(family_class, hook_class)`` and found with :func:`hook_for`, which walks the family's
  class hierarchy: a family without its own hook at a stage inherits its parent's. The hooks:
  ``runtime.proposer.Proposer`` (drafting a block on the torch and graph backends),
  ``export.rounds.ExportRound`` (which ONNX drafter graph, its I/O and its check),
  ``plan.trtllm_family.TrtllmRules`` (which TensorRT-LLM releases serve the family, its draft
  attention backend), ``train.objective.Objective`` (its extra training loss, initialisation and
  training sizes).

A new family implements: a :class:`DrafterFamily` subclass (traits, the hooks above that differ,
:meth:`~DrafterFamily.module_class` returning a ``Drafter`` subclass), registered here; and, only
where its behaviour differs from its parent's, a hook class per stage registered there.

Nothing here imports torch (planning reads configs without it); ``module_class`` imports the
module on first use.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

from dflash_trt.errors import CheckpointError

#: a ``config.DrafterConfig`` (which imports this module: not imported back, not even for types)
DrafterConfig = Any

#: Name prefixes a DFlash checkpoint's tensors may carry (``ingest.format_detect.STRIPPABLE_PREFIXES``, or none).
PREFIXES = ("", "dflash_module.", "model.", "draft_model.")


def dflash_config(cfg: dict) -> dict:
    """A raw ``config.json``'s ``dflash_config`` (empty when absent or not a mapping)."""
    d = cfg.get("dflash_config")
    return d if isinstance(d, dict) else {}


class DrafterFamily:
    """A drafter family's traits and model-level hooks; the base class is DFlash itself."""

    #: the registry key (``--arch``, ``inspect``'s format, messages)
    name: ClassVar[str] = "dflash"
    #: the ``architectures`` entry of its published ``config.json``
    architecture: ClassVar[str] = "DFlashDraftModel"
    #: the ``dflash_config`` keys the family adds to ``DrafterConfig`` (all set, or none)
    fields: ClassVar[tuple[str, ...]] = ()
    #: ``module:Class`` of its torch module (a ``Drafter`` subclass), imported on first use
    module: ClassVar[str] = "dflash_trt.model.drafter:Drafter"
    #: the drafter graph kind its export round writes (the manifest's ``graphs.drafter_graph``)
    graph: ClassVar[str] = "dflash"

    # -- recognition --------------------------------------------------------------------
    def recognises(self, cfg: dict, names: list[str]) -> bool:
        """Whether a raw ``config.json`` (and its tensor ``names``) is this family's.
        Default: the architecture, or any of its ``fields`` in ``dflash_config``."""
        archs = [str(a) for a in cfg.get("architectures") or []]
        return self.architecture in archs or any(k in dflash_config(cfg) for k in self.fields)

    def claims(self, cfg: DrafterConfig) -> bool:
        """Whether a ``DrafterConfig`` built without a ``family`` is this family's (its fields set)."""
        return bool(self.fields) and any(cfg.field(k) is not None for k in self.fields)

    # -- config ---------------------------------------------------------------------------
    def check_config(self, cfg: DrafterConfig) -> None:
        """Raise ValueError for an inconsistent config (default: its fields all set, or none)."""
        unset = [n for n in self.fields if cfg.field(n) is None]
        if unset:
            raise ValueError(f"{self.display} needs all of {', '.join(self.fields)}; missing {', '.join(unset)}")

    def check_checkpoint(self, cfg: dict, where) -> None:
        """Raise one-line CheckpointError for a raw ``config.json`` this family cannot build (before any
        tensor is read). Default: every field present, a positive integer."""
        d = dflash_config(cfg)
        missing = [k for k in self.fields if d.get(k) is None]
        if missing:
            raise CheckpointError(
                f"{where}: {self.display} drafter config lacks dflash_config."
                f"{', '.join(missing)}; the drafter cannot be built without them"
            )
        for key in self.fields:
            value = d[key]
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise CheckpointError(f"{where} (dflash_config): {key} is {value!r}; it must be a positive integer")

    def read_fields(self, dcfg: dict) -> dict[str, Any]:
        """The family's field values from a ``dflash_config`` (None where absent)."""
        return {k: dcfg.get(k) for k in self.fields}

    def zlab_form(self, cfg: DrafterConfig, out: dict) -> None:
        """Edit ``out`` (``DrafterConfig.to_zlab``'s DFlash form) into this family's published form.
        Default: its architecture, and its fields in ``dflash_config``."""
        out["architectures"] = [self.architecture]
        out["dflash_config"].update({k: cfg.field(k) for k in self.fields})

    # -- tensors ---------------------------------------------------------------------------
    def tensor_name(self, name: str) -> str:
        """The name the module holds a published tensor under (default: the same)."""
        return name

    def expected_shapes(self, cfg: DrafterConfig) -> dict[str, tuple[int, ...]]:
        """The tensors the family adds to the DFlash backbone's, by name (default: none)."""
        return {}

    def check_tensors(self, missing: list[str], where) -> None:
        """Refuse, before the generic "weights lack" line, missing tensors that say more (default: none)."""

    # -- the module and the pair -----------------------------------------------------------
    def module_class(self) -> type:
        """The torch module class (imports torch)."""
        mod, cls = self.module.split(":")
        return getattr(importlib.import_module(mod), cls)

    def describe(self, cfg: DrafterConfig) -> dict:
        """Extra entries of ``inspect``'s drafter description (default: its fields under its name)."""
        return {self.name: {k: cfg.field(k) for k in self.fields}} if self.fields else {}

    def shape_counts(self, cfg: dict, hidden: int, layers: int) -> dict[str, int]:
        """What the family adds to planning's ``DraftShape`` (fields named ``*_params`` add to its
        parameter count), from a raw ``config.json`` (default: nothing)."""
        return {}

    def pair_check(self, cfg: DrafterConfig, target_hidden: int, target_vocab: int) -> tuple[str, str] | None:
        """(status "ok" | "error", message) for the pair report, or None: nothing to say."""
        return None

    @property
    def display(self) -> str:
        """The name messages use (the architecture's stem: ``DFlash2`` for ``DFlash2DraftModel``)."""
        return self.architecture.removesuffix("DraftModel") or self.name

    def __repr__(self) -> str:
        return f"<drafter family {self.name}>"


#: name -> family, in registration order (the base DFlash first)
FAMILIES: dict[str, DrafterFamily] = {}


def register_family(family: DrafterFamily) -> DrafterFamily:
    """Add ``family`` (an instance) to the registry under its name; returns it."""
    if family.name in FAMILIES and type(FAMILIES[family.name]) is not type(family):
        raise ValueError(f"drafter family {family.name!r} is already registered by {type(FAMILIES[family.name])}")
    FAMILIES[family.name] = family
    return family


def family_named(name: str) -> DrafterFamily:
    """The registered family ``name`` (KeyError names the registered ones)."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown drafter family {name!r}; registered: {', '.join(FAMILIES)}") from None


def family_of(cfg: DrafterConfig) -> DrafterFamily:
    """The family a ``DrafterConfig`` describes: the one dispatch every stage goes through."""
    return family_named(cfg.family or infer(cfg).name)


def infer(cfg: DrafterConfig) -> DrafterFamily:
    """The family of a config built without a ``family``: the last registered that claims it, else DFlash."""
    for family in reversed(list(FAMILIES.values())):
        if family.claims(cfg):
            return family
    return FAMILIES["dflash"]


def recognise_family(cfg: dict, names: list[str]) -> DrafterFamily:
    """The family of a raw ``config.json`` and its tensor names: the last registered that recognises it
    (subclasses are registered after their parents, so they are asked first), else DFlash."""
    for family in reversed(list(FAMILIES.values())):
        if family.name != "dflash" and family.recognises(cfg, names):
            return family
    return FAMILIES["dflash"]


def drafter_for(cfg: DrafterConfig) -> Any:
    """The torch module class a drafter config describes (its family's ``module_class``; imports torch)."""
    return family_of(cfg).module_class()


def graph_kinds() -> set[str]:
    """The drafter graph kinds the registered families export."""
    return {f.graph for f in FAMILIES.values()}


def hook_for(registry: dict[type, Any], family: DrafterFamily) -> Any:
    """A higher stage's hook for ``family``: the entry of the nearest class in its hierarchy
    (``registry`` maps family classes to hooks; the base ``DrafterFamily`` must have one)."""
    for klass in type(family).__mro__:
        if klass in registry:
            return registry[klass]
    raise KeyError(f"no hook registered for {family!r} or its parents")


register_family(DrafterFamily())
