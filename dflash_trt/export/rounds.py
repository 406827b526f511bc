"""A drafter family's export round: which ONNX drafter graph it gets, its I/O, and its check.

The export stage of a drafter family (``model.family`` documents the seam). ``drafter.onnx`` is one
drafter round; what comes out of it depends on the family:

* :class:`ExportRound` (DFlash, every family's default): ``onnx_graphs.export_drafter_onnx``,
  KV injection and the block forward with the two ``dflash::`` custom ops, the target's head:
  logits out (graph kind ``dflash``; the TensorRT form). Beside it ``drafter_ort.onnx``
  (``onnx_native``): the same round in standard ops over a dense context cache, the form ONNX
  Runtime runs natively. Both checked against PyTorch on fresh shapes.
* :class:`DFlash2Export` (DFlash2): ``onnx_dflash2.export_dflash2_drafter_onnx``, the same round
  then the candidate selector's walk: anchor, uniforms, temperature in; tokens, q over the
  candidates, the candidates out (graph kind ``dflash2``). Checked at a greedy and a sampled
  temperature: the same tokens and candidates as PyTorch, q and the caches within tolerance.

The round's ``graph`` is recorded as the manifest's ``graphs.drafter_graph`` (the runtime picks
its ``Proposer`` by it); ``dynamic_axes`` names the profile dimension of each input the graph adds
(``engines.profile_shapes`` reads them). :func:`round_for` finds a family's round (the nearest
registered up its class hierarchy); a family whose graph differs registers its own with
:func:`register`.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from dflash_trt.errors import DFlashError
from dflash_trt.export import onnx_dflash2, onnx_native
from dflash_trt.export.onnx_graphs import DRAFTER_ONNX_ATOL, check_drafter_onnx, export_drafter_onnx
from dflash_trt.model import DFlash2Family, DrafterFamily, hook_for


class ExportRound:
    """DFlash: the drafter round with logits out."""

    #: the graph kind (``DrafterFamily.graph``, the manifest's ``graphs.drafter_graph``)
    graph: ClassVar[str] = "dflash"
    #: input -> {axis: profile dimension} for the inputs the graph adds to ``onnx_graphs.DRAFTER_INPUTS``
    dynamic_axes: ClassVar[dict[str, dict[int, str]]] = {}

    def export(self, drafter, head, onnx_dir: Path, page_size: int, say) -> dict[str, float]:
        """Write ``onnx_dir/drafter.onnx`` for ``drafter`` through the target head ``head`` [V, H] and
        check it against PyTorch; its max errors. A graph that disagrees is one DFlashError line."""
        say("exporting the drafter to ONNX (dflash::KVInjection, dflash::BlockDiffusionAttention)")
        path = export_drafter_onnx(drafter, onnx_dir, head_weight=head, page_size=page_size)
        err = check_drafter_onnx(drafter, path, head_weight=head, page_size=page_size)
        if max(err.values()) > DRAFTER_ONNX_ATOL:
            raise DFlashError(f"exported drafter ONNX disagrees with PyTorch (max error {max(err.values()):.2e})")
        say("exporting the drafter's ONNX Runtime form (standard ops over a dense context cache)")
        native = onnx_native.export_native_drafter_onnx(drafter, onnx_dir, head)
        n_err = onnx_native.check_native_drafter_onnx(drafter, native, head)
        if max(n_err.values()) > DRAFTER_ONNX_ATOL:
            raise DFlashError(
                f"exported drafter ONNX Runtime form disagrees with PyTorch (max error {max(n_err.values()):.2e})"
            )
        return {**err, **{f"ort_{k}": v for k, v in n_err.items()}}


class DFlash2Export(ExportRound):
    """DFlash2: the round, then the candidate selector's walk."""

    graph = "dflash2"
    dynamic_axes = onnx_dflash2.DFLASH2_DYNAMIC_AXES
    #: temperatures the graph is checked at: the greedy walk and a sampled one
    temperatures = (0.0, 0.8)

    def export(self, drafter, head, onnx_dir, page_size, say):
        say("exporting the DFlash2 drafter to ONNX (the DFlash round, then the candidate selector's walk)")
        path = onnx_dflash2.export_dflash2_drafter_onnx(drafter, onnx_dir, head_weight=head, page_size=page_size)
        err: dict[str, float] = {}
        for t in self.temperatures:
            got = onnx_dflash2.check_dflash2_drafter_onnx(
                drafter, path, head_weight=head, temperature=t, page_size=page_size
            )
            differing = got.pop("tokens_differing") + got.pop("candidates_differing")
            if differing:
                raise DFlashError(
                    f"exported DFlash2 drafter ONNX proposes other tokens than PyTorch at temperature "
                    f"{t} ({differing} tokens / candidates differ)"
                )
            worst = max(got.values())
            if worst > DRAFTER_ONNX_ATOL:
                raise DFlashError(
                    f"exported DFlash2 drafter ONNX disagrees with PyTorch at temperature {t} (max error {worst:.2e})"
                )
            for k, v in got.items():
                err[k] = max(err.get(k, 0.0), v)
        say("exporting the DFlash2 drafter's ONNX Runtime form (standard ops over a dense context cache)")
        native = onnx_native.export_native_drafter_onnx(drafter, onnx_dir, head)
        for t in self.temperatures:
            got = onnx_native.check_native_dflash2_onnx(drafter, native, head, temperature=t)
            differing = got.pop("tokens_differing") + got.pop("candidates_differing")
            if differing or max(got.values()) > DRAFTER_ONNX_ATOL:
                raise DFlashError(
                    f"exported DFlash2 drafter ONNX Runtime form disagrees with PyTorch at temperature "
                    f"{t} ({differing} tokens / candidates differ, max error {max(got.values()):.2e})"
                )
            for k, v in got.items():
                err[f"ort_{k}"] = max(err.get(f"ort_{k}", 0.0), v)
        return err


#: family class -> its export round class (``register``; found up the family's hierarchy by ``round_for``)
ROUNDS: dict[type, type[ExportRound]] = {}


def register_round(family: type[DrafterFamily], round_class: type[ExportRound]) -> None:
    """Export ``family``'s drafter (and its subclasses' without their own) with ``round_class``."""
    ROUNDS[family] = round_class


def round_for(family: DrafterFamily) -> ExportRound:
    """The export round of ``family`` (the nearest registered up its class hierarchy)."""
    return hook_for(ROUNDS, family)()


def drafter_dynamic_axes() -> dict[str, dict[int, str]]:
    """The profile dimensions of every registered round's extra drafter inputs."""
    out: dict[str, dict[int, str]] = {}
    for round_class in ROUNDS.values():
        out.update(round_class.dynamic_axes)
    return out


register_round(DrafterFamily, ExportRound)
register_round(DFlash2Family, DFlash2Export)
