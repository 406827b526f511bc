"""A job's text as tokens are committed: stop strings found, and what a stream may send.

Invariant: ``text`` is the detokenized output so far, cut before the first occurrence of any
stop string (OpenAI's semantics: the match itself is excluded); ``sent`` never exceeds the
text that can no longer turn into a match, i.e. ``len(text)`` minus the longest suffix of
``text`` that is a proper prefix of some stop string (held back until the next tokens
decide it). Tokens are decoded one at a time (:class:`IncrementalDetokenizer`), so a match is
found at the token that completes it, wherever the speculative round or the stream chunk
boundaries fall; :meth:`TextStream.feed` tells the runtime how many of a commit's tokens to
keep (``runtime.Request.match_stop``), so a match finishes the row, frees its slot, and no
token past it is generated into the response.

The worker thread feeds and pops; the event loop only receives the popped strings.
"""

from __future__ import annotations

from dflash_trt.serve.protocol import IncrementalDetokenizer


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


class TextStream:
    """Committed tokens -> the response text, cut at the first stop string (see the module)."""

    def __init__(self, tokenizer, stops: tuple[str, ...] = ()):
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stops = stops
        self.longest = max((len(s) for s in stops), default=0)
        self.text = ""
        self.sent = 0
        self.matched = False  # a stop string was found: the text is final
        self.ended = False  # the row finished: nothing is held back any more

    def _append(self, delta: str) -> bool:
        """Add ``delta``; True (and the text cut) when a stop string now occurs."""
        start = max(0, len(self.text) - self.longest + 1)
        self.text += delta
        if not self.stops or not delta:
            return False
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if not hits:
            return False
        self.text, self.matched = self.text[: min(hits)], True
        return True

    def feed(self, tokens: list[int]) -> int | None:
        """Take a commit's tokens in order; the count up to and including the one that completes
        a stop string (the rest are not taken), or None when none does."""
        if self.matched:
            return 0
        if not self.stops:  # nothing to find: one decode per commit, as streaming did before
            self._append(self.detok.add(list(tokens)))
            return None
        for j, tok in enumerate(tokens):
            if self._append(self.detok.add([tok])):
                return j + 1
        return None

    def finish(self) -> None:
        """The row ended: what the detokenizer held back (an incomplete character) joins the text."""
        if not self.matched and not self.ended:
            self._append(self.detok.flush())
        self.ended = True  # nothing more can match: the held-back tail is released

    def pop(self) -> str:
        """The text that is safe to send now and was not sent yet."""
        end = len(self.text) if self.matched or self.ended else len(self.text) - held_back(self.text, self.stops)
        out, self.sent = self.text[self.sent : end], max(self.sent, end)
        return out
