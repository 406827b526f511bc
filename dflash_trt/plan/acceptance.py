"""The acceptance model the planner assumes: geometric per-position acceptance.

Per-position acceptance ``alpha`` is fitted so that a full block of ``B`` gives the expected
acceptance length tau (the mean tokens committed per target forward)::

    tau(L) = 1 + alpha + ... + alpha^L = (1 - alpha^(L+1)) / (1 - alpha)

(The per-family tau estimates the planner starts from are ``plan.DEFAULT_TAU``.)
"""

from __future__ import annotations


def fit_alpha(tau: float, block: int) -> float:
    """Per-position acceptance alpha with 1 + alpha + ... + alpha^(block-1) = tau."""
    if tau >= block:
        return 0.9999
    if tau <= 1:
        return 0.0
    lo, hi = 0.0, 0.9999
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tau(mid, block - 1) < tau else (lo, mid)
    return (lo + hi) / 2


def expected_tau(alpha: float, draft_len: int) -> float:
    return sum(alpha**k for k in range(draft_len + 1))
