"""A target and its drafter, read once: the one value every later stage takes.

:func:`read_pair` reads each model's ``config.json`` and safetensors headers once (``read_target``,
``read_drafter``), checks the pair on those specs (``compat.check_pair``), and reads the little
else the stages need (the chat template's switch, the drafter's training settings, a drafter's
quantization block). The result, :class:`PairSpec`, is frozen: ``plan`` sizes it, ``deploy`` writes
it, the drafter is loaded from it; none of them is handed the directories to read again
(``tests/deploy/test_read_once.py`` counts the reads of ``build tiny``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dflash_trt.ingest.chat import serving_chat, trained_chat
from dflash_trt.ingest.compat import PairReport, check_pair
from dflash_trt.ingest.drafter import DrafterSpec, read_drafter
from dflash_trt.ingest.target import TargetSpec, read_target, target_quantization


@dataclass(frozen=True)
class PairSpec:
    """What ``ingest`` established about a (target, drafter) pair, from one read of each file."""

    target: TargetSpec
    drafter: DrafterSpec
    report: PairReport
    weights: bool  # read as checkpoints (weights required), not config-only
    serving_chat: dict  # the target's template sha256 and thinking switch, as served
    trained_chat: dict | None  # the chat settings the drafter was trained with (training.json)
    drafter_quantization: dict | None  # a quantization block in the drafter's config (refused for TensorRT-LLM)

    @property
    def target_dir(self) -> Path:
        return self.target.path

    @property
    def drafter_dir(self) -> Path:
        return self.drafter.path

    @property
    def quantization(self) -> dict | None:
        """The target's shipped quantization (None: plain BF16/FP16 weights)."""
        return self.target.quantization

    @property
    def family(self) -> str | None:
        """The drafter's family (``dflash``, ``dflash2``, ...; None: the config does not say)."""
        return self.drafter.config.family

    @property
    def target_layer_ids(self) -> list[int]:
        """The target layers the drafter reads (z-lab convention)."""
        return list(self.drafter.config.target_layer_ids)

    @property
    def warnings(self) -> list[str]:
        return list(self.report.warnings)


def read_pair(
    target_dir: str | Path,
    drafter_dir: str | Path,
    *,
    require_weights: bool = True,
    enable_thinking: bool | None = None,
) -> PairSpec:
    """Read and check a pair (``validate_pair``'s refusals, one line each); ``enable_thinking``:
    the switch the deployment serves with (recorded beside the template's)."""
    t = read_target(target_dir, require_weights=require_weights)
    d = read_drafter(drafter_dir, require_weights=require_weights)
    report = check_pair(t, d, require_weights=require_weights)
    return PairSpec(
        target=t,
        drafter=d,
        report=report,
        weights=require_weights,
        serving_chat=serving_chat(t.path, enable_thinking),
        trained_chat=trained_chat(d.path),
        drafter_quantization=target_quantization(d.path, d.raw_config),
    )
