"""The OpenAI request fields the embedded server does not implement, and its rule for them.

Rule: every field of OpenAI's completions and chat completions requests is either honoured
(``protocol``), or declared here with the values that change nothing (what clients send by
default: ``0``, ``null``, ``{}``, ``1``, ``false``) and refused by name (400, ``param``) at any
other value. Fields that cannot change the output (``user``, ``metadata``, cache keys) are
accepted at any value of their type. Types are strict (pydantic strict mode on the request
models): ``"0"`` for a number or ``0`` for a boolean is a 400, never coerced. A field OpenAI
does not define and this server does not extend is refused by name too (``extra="forbid"``).

docs/guides/serve.md's "OpenAI fields" table lists the same decisions.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

MAX_STOPS = 4  # OpenAI's limit on stop sequences


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` honoured; ``include_obfuscation`` a no-op (no padding)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class CompletionFields(BaseModel):
    """Completions fields not implemented: accepted only at their no-op values (:data:`COMPLETION_NOOPS`)."""

    model_config = ConfigDict(strict=True)

    best_of: int | None = None
    echo: bool = False
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = None
    suffix: str | None = None
    user: str | None = None


class ChatFields(BaseModel):
    """Chat fields not implemented: accepted only at their no-op values (:data:`CHAT_NOOPS`)."""

    model_config = ConfigDict(strict=True)

    audio: dict[str, Any] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    function_call: str | dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    modalities: list[str] | None = None
    prediction: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    response_format: dict[str, Any] | None = None
    service_tier: str | None = None
    store: bool | None = None
    tool_choice: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    verbosity: str | None = None
    web_search_options: dict[str, Any] | None = None
    # cannot change the output: accepted at any value
    user: str | None = None
    metadata: dict[str, str] | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    parallel_tool_calls: bool | None = None  # only means something with tools, which are refused


_PENALTY = (None, 0)
COMMON_NOOPS: dict[str, tuple] = {
    "n": (None, 1),
    "frequency_penalty": _PENALTY,
    "presence_penalty": _PENALTY,
    "logit_bias": (None, {}),
}
COMPLETION_NOOPS: dict[str, tuple] = {
    **COMMON_NOOPS,
    "best_of": (None, 1),
    "echo": (False,),
    "logprobs": (None,),
    "suffix": (None, ""),
}
CHAT_NOOPS: dict[str, tuple] = {
    **COMMON_NOOPS,
    "audio": (None,),
    "function_call": (None, "none"),
    "functions": (None, []),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "response_format": (None, {"type": "text"}),
    "service_tier": (None, "auto", "default"),
    "store": (None, False),
    "tool_choice": (None, "none", "auto"),
    "tools": (None, []),
    "verbosity": (None,),
    "web_search_options": (None,),
}

# message fields, per role; "content" parts other than text are refused in protocol.ChatRequest.encode
ROLES = {"system", "developer", "user", "assistant"}
MESSAGE_NOOPS: dict[str, tuple] = {
    "tool_calls": (None, []),
    "function_call": (None,),
    "audio": (None,),
    "refusal": (None,),
}


QUOTE_CHARS = 80  # the most of one client value an error message repeats
MESSAGE_CHARS = 1000  # the most any error message says (every value in it quoted already)


def quoted(text: str, limit: int = QUOTE_CHARS) -> str:
    """``text`` as an error repeats it: its first ``limit`` characters, then how long it was
    (a multi-megabyte field is never echoed back)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _show(v: Any) -> str:
    return "null" if v is None else quoted(repr(v).replace("True", "true").replace("False", "false"))


def unsupported(req: BaseModel, noops: dict[str, tuple]) -> tuple[str, str] | None:
    """(param, message) for the first field of ``req`` at a value this server does not implement."""
    for name, allowed in noops.items():
        value = getattr(req, name)
        if not any(value == a and type(value) is not bool or value is a for a in allowed):
            shown = " or ".join(_show(a) for a in allowed)
            return name, (
                f"{name} = {_show(value)} is not supported by the embedded server "
                f"(accepted only as {shown}, which changes nothing)"
            )
    return None


def stop_strings(stop: None | str | list[str]) -> tuple[tuple[str, ...], str | None]:
    """The stop sequences of ``stop`` (a string or up to 4), and why they are refused (None: fine)."""
    stops = () if stop is None else (stop,) if isinstance(stop, str) else tuple(stop)
    if len(stops) > MAX_STOPS:
        return stops, f"stop: at most {MAX_STOPS} stop sequences, got {len(stops)}"
    if any(s == "" for s in stops):
        return stops, "stop: a stop sequence must not be empty"
    return stops, None
