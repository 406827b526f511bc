"""A drafter family's TensorRT-LLM rules: which releases serve it, which draft attention it runs.

The planning stage of a drafter family (``model.family`` documents the seam; this module imports
no torch). :class:`TrtllmRules` is DFlash's (every family's default): every release in
``trtllm_releases`` serves it through ``DFlashDecodingConfig``, and the recipe's
``speculative.attention_backend`` follows the one rule keyed on the drafter's layers. A family
whose serving differs subclasses it (DFlash2: ``trtllm_dflash2.DFlash2Rules``) and registers the
subclass with :func:`register`.

:func:`check_drafter` and :func:`drafter_attention_backend` are what ``deploy`` calls: the one
dispatch (``model.family_of``), then the family's rules.
"""

from __future__ import annotations

from dflash_trt.errors import RecipeError
from dflash_trt.model import DrafterFamily, family_of, hook_for
from dflash_trt.plan import trtllm_releases
from dflash_trt.plan.trtllm_releases import Release
from dflash_trt.plan.trtllm_rules import draft_attention_backend


class TrtllmRules:
    """DFlash: served by every release; the draft attention backend as requested."""

    def serves(self, release: str) -> bool:
        """Whether TensorRT-LLM ``release`` serves the family (DFlash: every release the table knows)."""
        return True

    def serving_releases(self) -> list[str]:
        """The releases that serve the family, in the table's order."""
        return [r.version for r in trtllm_releases.RELEASES if self.serves(r.version)]

    def check(self, cfg, release: str) -> None:
        """A one-line RecipeError when ``release`` cannot serve drafter config ``cfg`` (``DrafterConfig``)."""
        if not self.serves(release):
            family = family_of(cfg)
            where = " or ".join(self.serving_releases())
            raise RecipeError(
                f"TensorRT-LLM {release} does not serve {family.display} drafters "
                f"({family.architecture}); "
                + (f"set trtllm.release to {where}, or " if where else "")
                + "run the pair on the reference runtime"
            )

    def attention_backend(self, requested: str, cfg, sm: int, release: Release) -> str:
        """``speculative.attention_backend`` for drafter config ``cfg`` on GPU ``sm``: the rule keyed on the
        drafter's layers that every family shares (non-causal sliding windows rule out TRTLLM, PR #19159)."""
        return draft_attention_backend(requested, cfg, sm, release)


#: family class -> its rules class (``register``; found up the family's hierarchy by ``rules_for``)
RULES: dict[type, type[TrtllmRules]] = {}


def register_trtllm_rules(family: type[DrafterFamily], rules: type[TrtllmRules]) -> None:
    """Serve ``family`` (and its subclasses without their own) under ``rules``."""
    RULES[family] = rules


def rules_for(family: DrafterFamily) -> TrtllmRules:
    """The TensorRT-LLM rules of ``family`` (the nearest registered up its class hierarchy)."""
    return hook_for(RULES, family)()


def check_drafter(cfg, release: str) -> None:
    """Drafter config ``cfg`` served by TensorRT-LLM ``release``, or a one-line RecipeError."""
    rules_for(family_of(cfg)).check(cfg, release)


def drafter_attention_backend(requested: str, cfg, sm: int, release: Release) -> str:
    """The draft attention backend drafter config ``cfg`` runs with on ``release`` (its family's rule)."""
    return rules_for(family_of(cfg)).attention_backend(requested, cfg, sm, release)


register_trtllm_rules(DrafterFamily, TrtllmRules)
