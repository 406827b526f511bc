"""User-facing errors.

Anything the user can fix (a bad path, a bad recipe key, a pair that does not match, a
precision the GPU cannot run) raises :class:`DFlashError`. The CLI prints its message as
one line on stderr and exits with code 2; no traceback.
"""

from __future__ import annotations


class DFlashError(Exception):
    """A user error: the message says what is wrong and what to do."""

    exit_code = 2


class RecipeError(DFlashError):
    """A recipe file or override is invalid."""


class CheckpointError(DFlashError):
    """A checkpoint is missing, corrupt, or in a format we cannot use."""


class CompatibilityError(DFlashError):
    """A target and drafter do not belong together."""


class HardwareError(DFlashError):
    """A GPU/precision/memory combination cannot work."""


class MissingExtraError(DFlashError):
    """An optional dependency is not installed."""

    def __init__(self, package: str, extra: str, purpose: str):
        super().__init__(
            f"{purpose} needs the '{package}' package: pip install 'dflash-trt[{extra}]'"
        )


def require(module: str, extra: str, purpose: str):
    """Import an optional dependency or raise a one-line error naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError(module.split(".")[0], extra, purpose) from exc
