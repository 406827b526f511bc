"""Counters of one ``generate`` call: τ, per-position acceptance, and where the time went.

Counted the way vLLM v1 counts drafts (``vllm/v1/spec_decode/metrics.py``,
``SpecDecodingStats.observe_draft``): one :meth:`Stats.observe` call per verify round, with
the accepted count and the committed count of every row in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Stats:
    """Counters of one generate call, over all its sequences.

    A *round* here is a sequence-round: one row through one verify forward. Prefill is no
    round (its one token per row is counted in ``new_tokens`` only).
    """

    block_size: int
    rounds: int = 0  # sequence-rounds: one per sequence per target forward
    committed: int = 0  # tokens committed in those rounds (accepted + bonus)
    target_forwards: int = 0  # batched target forwards, prefill included
    accepted_at: list[int] = field(default_factory=list)  # per draft position k: rounds with acc >= k
    prompt_tokens: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    prefill_seconds: float = 0.0  # the target's prefill forward and the first token
    draft_seconds: float = 0.0  # drafter rounds: KV injection of the last commit + block forward
    verify_seconds: float = 0.0  # target forwards in rounds (prefill excluded)

    def __post_init__(self):
        if not self.accepted_at:
            self.accepted_at = [0] * max(0, self.block_size - 1)

    def observe(self, acc: list[int], produced: list[int]) -> None:
        """Count one verify round (one batched target forward): row r accepted ``acc[r]``
        drafts and committed ``produced[r]`` tokens.

        ``produced`` is what the row kept (accepted + bonus, cut at a stop token or the
        length limit); ``acc`` is what the target accepted, uncut, so per-position
        acceptance measures the drafter, not the request's limits.
        """
        self.target_forwards += 1
        self.rounds += len(acc)
        self.committed += sum(produced)
        for k in range(1, len(self.accepted_at) + 1):
            self.accepted_at[k - 1] += sum(a >= k for a in acc)

    @property
    def acceptance_length(self) -> float:
        """τ: mean tokens committed per sequence per target forward (1 <= τ <= B)."""
        return self.committed / self.rounds if self.rounds else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / self.rounds if self.rounds else 0.0 for a in self.accepted_at]

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "block_size": self.block_size,
            "acceptance_length": round(self.acceptance_length, 4),
            "per_position_acceptance": [round(x, 4) for x in self.per_position_acceptance],
            "target_forwards": self.target_forwards,
            "rounds": self.rounds,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "seconds": round(self.seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "prefill_seconds": round(self.prefill_seconds, 4),
            "draft_seconds": round(self.draft_seconds, 4),
            "verify_seconds": round(self.verify_seconds, 4),
        }
