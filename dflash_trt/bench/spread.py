"""Repeats, their spread, and the rule that decides nothing noise could explain.

A level measured ``n`` times has an interval per figure: ``{values, mean, min, max}``
(:func:`interval`). Two intervals differ *beyond noise* only when they do not overlap
(``a.min > b.max``) and their means differ by more than :data:`MIN_DIFFERENCE` (:func:`beyond`):
the min–max of a few repeats understates a machine's noise (two tied settings give disjoint
intervals of three repeats one time in ten), so a smaller difference is never a conclusion. A
single repeat has no spread, so nothing measured once is beyond noise. A ratio's interval is
``[a.min / b.max, a.max / b.min]`` (:func:`ratio`), and a ratio "pays" only when ``a`` is beyond
``b``. Where two levels are indistinguishable the caller applies a fixed rule (tune: keep the
length of the level before), so two runs on one machine decide the same.

Repeats whose relative range ``(max - min) / mean`` exceeds :data:`NOISY` mark the machine as
noisy (:func:`noisy`): the figures stand, with a warning.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

NOISY = 0.15  # repeats more than 15% apart (relative range): the machine was noisy
MIN_DIFFERENCE = 0.05  # means closer than 5% are never told apart


def interval(values: Sequence[float | None], digits: int = 3) -> dict | None:
    """``{values, mean, min, max}`` of the repeats that measured something (None: none did)."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None
    return {
        "values": [round(x, digits) for x in xs],
        "mean": round(statistics.fmean(xs), digits),
        "min": round(min(xs), digits),
        "max": round(max(xs), digits),
    }


def beyond(a: dict | None, b: dict | None) -> bool:
    """``a`` is higher than ``b`` beyond their spread: both repeated, intervals apart, means more
    than :data:`MIN_DIFFERENCE` apart."""
    if not a or not b or len(a["values"]) < 2 or len(b["values"]) < 2:
        return False
    return a["min"] > b["max"] and a["mean"] > b["mean"] * (1 + MIN_DIFFERENCE)


def verdict(a: dict | None, b: dict | None) -> str:
    """ "higher", "lower" or "indistinguishable" (``a`` against ``b``)."""
    return "higher" if beyond(a, b) else "lower" if beyond(b, a) else "indistinguishable"


def ratio(a: dict | None, b: dict | None, digits: int = 4) -> dict | None:
    """The interval of ``a / b``: ``{mean (of the means), min, max}``."""
    if not a or not b or not b["min"] or not b["mean"]:
        return None
    return {
        "mean": round(a["mean"] / b["mean"], digits),
        "min": round(a["min"] / b["max"], digits),
        "max": round(a["max"] / b["min"], digits),
    }


def relative_range(iv: dict | None) -> float | None:
    if not iv or not iv["mean"]:
        return None
    return (iv["max"] - iv["min"]) / iv["mean"]


def noisy(iv: dict | None, threshold: float = NOISY) -> bool:
    r = relative_range(iv)
    return r is not None and r > threshold
