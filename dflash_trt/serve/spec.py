"""What one embedded server is asked to serve with, in one typed object (:class:`ServeSpec`).

Invariant: every limit the server applies comes from here, checked once when the spec is made
(pydantic: a wrong type or a value out of range is refused before any model or worker starts);
``create_app(pair, spec=...)`` reads nothing else. What depends on the pair (the block size, the
engines' profile) is the scheduler's to check (``runtime.Scheduler``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ServeSpec(BaseModel):
    """The embedded server's settings (``serve``'s flags; None: the pair's or the bundle's own)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_name: str | None = None  # the id clients send (None: the pair's name)
    max_queue: int = Field(64, ge=0)  # waiting requests before 429
    max_batch: int | None = Field(None, ge=1)  # None: the bundle's planned max_batch_size, else 8
    block_size: int | None = Field(None, ge=1)  # None: the drafter's trained block
    max_model_len: int | None = Field(None, ge=1)  # None: the target's max_position_embeddings
    default_max_tokens: int = Field(16, ge=1)  # /v1/completions without max_tokens
    torch_threads: int | None = Field(None, ge=1)
    api_key: str | None = Field(None, repr=False)  # never in a repr or a log
    max_body_bytes: int = Field(4 << 20, ge=1)
    template_timeout_s: float = Field(5.0, gt=0)
    template_max_chars: int = Field(8 << 20, ge=1)
