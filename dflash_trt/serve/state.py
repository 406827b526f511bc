"""What one embedded-server app serves, in one object the routes read (``app.state.server``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dflash_trt.runtime import Pair
from dflash_trt.serve.batcher import Batcher

if TYPE_CHECKING:  # metrics imports prometheus_client on use; only its type is needed here
    from dflash_trt.serve.metrics import ServerMetrics
    from dflash_trt.serve.render import ChatRenderer


@dataclass
class ServerState:
    """The pair and its limits, the batch worker, the metrics and the responses still open.

    ``open_responses`` counts requests admitted whose response has not finished (a stream
    closes its count when it ends); with the batcher's queue and running rows it says whether
    a draining server may stop yet (:meth:`busy`).
    """

    pair: Pair
    model_name: str
    context_len: int  # the longest prompt + completion, in tokens
    block_size: int  # B, reported in every response's "dflash" extension
    default_max_tokens: int  # /v1/completions without max_tokens
    batcher: Batcher
    metrics: ServerMetrics
    created: int = field(default_factory=lambda: int(time.time()))
    open_responses: int = 0
    chat: ChatRenderer | None = None  # the chat template's renderer (None: the tokenizer has none)

    def busy(self) -> bool:
        return bool(self.open_responses or self.batcher.queue_depth or self.batcher.running)
