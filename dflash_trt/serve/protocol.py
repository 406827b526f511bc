"""OpenAI request bodies the embedded server accepts, its error type, and streaming detokenization."""

from __future__ import annotations

from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field

from dflash_trt.serve import fields
from dflash_trt.serve.fields import ChatFields, CompletionFields, StreamOptions


class APIError(Exception):
    """Answered as ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code


class _Common(BaseModel):
    # Every field is honoured or refused by name (serve/fields.py): types are strict, unknown
    # fields refused, unimplemented ones accepted only at their no-op values (check_supported).
    model_config = ConfigDict(strict=True, extra="forbid")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)
    seed: int | None = None
    n: int | None = 1
    stop: None | str | list[str] = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False

    def stops(self) -> tuple[str, ...]:
        """The stop sequences (a string or up to 4, none empty: checked in check_supported)."""
        return fields.stop_strings(self.stop)[0]

    def check_fields(self, noops: dict[str, tuple]) -> None:
        """Unimplemented fields only at their no-op values; stop sequences OpenAI allows."""
        if (bad := fields.unsupported(self, noops)) is not None:
            raise APIError(400, bad[1], param=bad[0])
        if (why := fields.stop_strings(self.stop)[1]) is not None:
            raise APIError(400, why, param="stop")
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed with stream: true", param="stream_options")

    def check_supported(self) -> None:
        if self.top_k == -1:  # vLLM's spelling of "no top-k"
            self.top_k = 0


class CompletionRequest(_Common, CompletionFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    return_token_ids: bool = False  # vLLM's extension: the response ids in choices[0].token_ids

    def check_supported(self) -> None:
        super().check_supported()
        self.check_fields(fields.COMPLETION_NOOPS)

    def prompt_value(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise APIError(400, "one prompt per request: send a string or a list of token ids", param="prompt")
            p = p[0]
        if isinstance(p, list) and not p:
            raise APIError(400, "the prompt is empty", param="prompt")
        return cast("str | list[int]", p)  # one string or one id list, as the schema's union allows


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    role: str
    content: None | str | list[dict[str, Any]] = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    function_call: dict[str, Any] | None = None
    audio: dict[str, Any] | None = None
    refusal: str | None = None
    tool_call_id: str | None = None  # tool messages: their role is refused

    def check(self, i: int) -> None:
        """Roles the chat template takes (tools are refused), message fields at no-op values."""
        if self.role not in fields.ROLES:
            raise APIError(
                400,
                f"messages[{i}].role {fields.quoted(repr(self.role))} is not supported; use one of "
                f"{', '.join(sorted(fields.ROLES))}",
                param=f"messages[{i}].role",
            )
        if (bad := fields.unsupported(self, fields.MESSAGE_NOOPS)) is not None:
            raise APIError(400, f"messages[{i}].{bad[1]}", param=f"messages[{i}].{bad[0]}")


class ChatRequest(_Common, ChatFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    add_generation_prompt: bool = True

    def check_supported(self) -> None:
        super().check_supported()
        self.check_fields(fields.CHAT_NOOPS)
        for i, m in enumerate(self.messages):
            m.check(i)

    def template_messages(self, tokenizer) -> list[dict]:
        """The messages as the chat template takes them (rendered by ``serve/render.py``)."""
        if not getattr(tokenizer, "chat_template", None):
            raise APIError(400, "this model's tokenizer has no chat template: use /v1/completions", param="messages")
        msgs = []
        for m in self.messages:
            content = m.content
            if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
                if any(part.get("type") != "text" for part in content):
                    raise APIError(400, "only text content parts are supported", param="messages")
                content = "".join(str(part.get("text", "")) for part in content)
            msg = {"role": "system" if m.role == "developer" else m.role, "content": content or ""}
            if m.name is not None:
                msg["name"] = m.name
            msgs.append(msg)
        return msgs


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """One line from pydantic/FastAPI validation errors, and the offending parameter."""
    if not errors:
        return "invalid request", None
    e = errors[0]
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    if e.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {e.get('ctx', {}).get('error', e.get('msg'))}", None
    param = fields.quoted(".".join(loc)) or None  # a field name is the client's too
    where = f"{param}: " if param else ""
    return f"{where}{fields.quoted(str(e.get('msg', 'invalid value')), 300)}", (fields.quoted(loc[0]) if loc else None)


class IncrementalDetokenizer:
    """Text deltas from a growing token list; holds back an incomplete UTF-8 character."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # start of the window decoded for context
        self.read = 0  # tokens whose text was already emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def add(self, new: list[int]) -> str:
        self.ids.extend(new)
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return after[len(before) :] if len(after) > len(before) else ""
