"""A row and the batch of rows between rounds: :class:`Request`, :func:`take`, :class:`Batch`.

Invariant: row ``r`` of every tensor of a :class:`Batch` is ``Batch.rows[r]``; rows leave
(:meth:`Batch.filter`) and join (:meth:`Batch.merge`) only between rounds, each through the
backend, so a row's tokens never depend on what shares its batch. :func:`take` is the one
place a row takes tokens and finishes. Between rounds every row holds the invariant of
``loop.py``'s docstring (what the caches hold, which token is the anchor).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from dflash_trt.runtime.backend import Backend
from dflash_trt.runtime.sampling import SamplingParams, noise_key


@dataclass(eq=False)
class Request:
    """One prompt's generation: what it asks for, and what it has got so far.

    ``stream`` numbers a seeded row's noise (``sampling.noise_key(seed, stream)``): a prompt's
    index in one ``generate`` call, 0 for a request of its own, so a request with a seed gives
    the same tokens as ``generate([prompt], sampling=...)`` with that seed. ``on_commit(new)``
    gets the tokens kept after every commit (streaming); ``should_stop()`` is asked after every
    commit, and yes finishes the row as ``"cancelled"`` (a client that went away).
    """

    prompt: list[int]
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop_token_ids: frozenset[int] = frozenset()
    stream: int = 0
    on_commit: Callable[[list[int]], None] | None = None
    should_stop: Callable[[], bool] | None = None
    match_stop: Callable[[list[int]], int | None] | None = None
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop", "length", "cancelled" or "error" once finished
    error: str | None = None  # why, when "error" (the scheduler failed this row alone)
    rounds: int = 0  # rounds this row went through (prefill excluded)
    committed: int = 0  # tokens those rounds committed (accepted + bonus, as kept)

    @property
    def noise_key(self) -> int | None:
        s = self.sampling
        return None if s.greedy or s.seed is None else noise_key(s.seed, self.stream)

    @property
    def acceptance_length(self) -> float | None:
        """This row's τ: tokens committed per round."""
        return self.committed / self.rounds if self.rounds else None


def take(rows: list[Request], new: list[list[int]]) -> tuple[list[int], list[int]]:
    """The one place finishing is decided: append ``new[r]`` to row r, cut at its length limit
    after a stop token or a stop string's match, then ask whether it goes on. Returns (tokens kept per row, the
    indices of the rows that go on)."""
    kept, going = [], []
    for r, (req, toks) in enumerate(zip(rows, new, strict=True)):
        toks = toks[: req.max_new_tokens - len(req.token_ids)]
        for j, tok in enumerate(toks):
            if tok in req.stop_token_ids:
                toks = toks[: j + 1]
                req.finish_reason = "stop"
                break
        if req.match_stop is not None and (cut := req.match_stop(toks)) is not None:
            toks, req.finish_reason = toks[:cut], "stop"  # a stop string: the row ends like at EOS
        req.token_ids.extend(toks)
        kept.append(len(toks))
        if req.on_commit is not None:
            req.on_commit(toks)
        if req.finish_reason is None and len(req.token_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
        if req.finish_reason is None and req.should_stop is not None and req.should_stop():
            req.finish_reason = "cancelled"
        if req.finish_reason is None:
            going.append(r)
    return kept, going


@dataclass
class Batch:
    """The rows still generating, as one batch; row ``r`` of every tensor is ``rows[r]``, and
    between rounds every row holds the invariant in this module's docstring.

    col_valid [n, S]: which of the target cache's S columns are real (False: padding or a
    rejected position). positions [n]: the anchor's position, i.e. the tokens committed
    before it. last [n]: the anchor. target_hidden [n, T, n_tap*H] / n_new [n]: the last
    commit, not yet injected into the drafter cache (None without a drafter).
    """

    rows: list[Request]
    target_cache: object
    draft_cache: object | None
    col_valid: torch.Tensor
    positions: torch.Tensor
    last: torch.Tensor
    target_hidden: torch.Tensor | None
    n_new: torch.Tensor

    def filter(self, backend: Backend, keep: list[int]) -> bool:
        """Keep only rows ``keep`` (indices into this batch); False when none are left."""
        if len(keep) == len(self.rows):
            return True
        self.rows = [self.rows[r] for r in keep]
        if not self.rows:
            return False
        idx = torch.tensor(keep, dtype=torch.long, device=self.last.device)
        backend.keep_rows(self.target_cache, self.draft_cache, idx)
        self.col_valid, self.positions, self.last, self.n_new = (
            self.col_valid[idx],
            self.positions[idx],
            self.last[idx],
            self.n_new[idx],
        )
        if self.target_hidden is not None:
            self.target_hidden = self.target_hidden[idx]
        return True

    def merge(self, backend: Backend, other: Batch) -> None:
        """Append ``other``'s rows after this batch's (both between rounds). The target caches'
        column counts are padded on the right to the larger one, the padding columns holes."""
        S = max(self.col_valid.shape[1], other.col_valid.shape[1])
        self.target_cache, self.draft_cache = backend.merge_rows(
            self.target_cache, self.draft_cache, other.target_cache, other.draft_cache
        )
        self.col_valid = torch.cat([_pad(self.col_valid, 1, S), _pad(other.col_valid, 1, S)])
        self.rows = self.rows + other.rows
        self.positions = torch.cat([self.positions, other.positions])
        self.last = torch.cat([self.last, other.last])
        self.n_new = torch.cat([self.n_new, other.n_new])
        if self.target_hidden is not None:
            assert other.target_hidden is not None, "merged batches both draft (or neither does)"
            T = max(self.target_hidden.shape[1], other.target_hidden.shape[1])
            self.target_hidden = torch.cat([_pad(self.target_hidden, 1, T), _pad(other.target_hidden, 1, T)])


def _pad(x: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``x`` zero- (False-) padded at the end of ``dim`` to ``size``."""
    extra = size - x.shape[dim]
    if extra == 0:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, x.new_zeros(shape)], dim=dim)
