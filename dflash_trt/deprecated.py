"""Renames after a release: an old spelling keeps working for at least one release and warns once.

Invariant (CHANGELOG.md, "Deprecation policy"): before the first release nothing here is used,
since a replaced spelling is removed outright; after one, a command that still reads an old
option or key calls :func:`alias_warning`, which says on stderr, once per process and spelling,
what to write instead and the release that removes the old one. Nothing else changes: the
command then proceeds with the new spelling's value.
"""

from __future__ import annotations

import sys

_warned: set[str] = set()


def alias_warning(old: str, new: str, removed_in: str) -> bool:
    """Warn once that ``old`` is deprecated; True when this call printed the line."""
    if old in _warned:
        return False
    _warned.add(old)
    print(
        f"warning: {old} is deprecated and is removed in dflash-trt {removed_in}: use {new}",
        file=sys.stderr,
        flush=True,
    )
    return True
