"""The OpenAI request bodies we accept (pydantic) and the response / chunk bodies we send (plain dicts).

Field ranges follow OpenAI's: temperature in [0, 2], top_p in (0, 1], max_tokens >= 1, n = 1 only,
at most 4 stop strings. Fields we cannot honour (logprobs, echo, best_of > 1, suffix, penalties != 0,
tools) are refused with a 400 naming them instead of being silently ignored. `top_k` is an extension
(0 or -1 = off). Every response carries `usage` with the request's `tau` and `blocks` added.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from .errors import APIError

MAX_STOPS = 4
_BIG = 2**31 - 1

Penalty = Field(default=None, ge=-2.0, le=2.0, allow_inf_nan=False)


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: Optional[int] = Field(default=None, ge=1, le=_BIG)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: Optional[int] = Field(default=None, ge=-1, le=_BIG)
    n: Optional[int] = Field(default=1, ge=1, le=128)
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[int] = Field(default=None, ge=0, le=2**63 - 1)
    presence_penalty: Optional[float] = Penalty
    frequency_penalty: Optional[float] = Penalty
    logprobs: Optional[Any] = None
    user: Optional[str] = None

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOPS:
            raise APIError(400, f"at most {MAX_STOPS} stop sequences (got {len(stops)})", "stop", "invalid_value")
        if any(s == "" for s in stops):
            raise APIError(400, "stop sequences must be non-empty strings", "stop", "invalid_value")
        return stops

    def check_supported(self) -> None:
        if self.n not in (None, 1):
            raise APIError(400, f"n={self.n} is not supported: one choice per request (n=1)", "n", "invalid_value")
        for name in ("presence_penalty", "frequency_penalty", "logprobs"):
            if getattr(self, name) not in (None, 0):  # 0 == 0.0 == False: the default, in any spelling
                raise APIError(400, f"{name} is not supported (omit it, or send 0)", name, "unsupported")
        for name in self.unsupported_fields:
            value = (self.model_extra or {}).get(name)
            unset = value is None or value is False or (isinstance(value, (str, list, dict)) and not value)
            if not (unset or (name == "best_of" and type(value) is int and value == 1)):
                raise APIError(400, f"{name} is not supported", name, "unsupported")

    unsupported_fields: ClassVar[tuple[str, ...]] = ()  # extra fields refused unless null/default


class CompletionRequest(_Common):
    prompt: Union[str, list[int], list[str], list[list[int]]]
    unsupported_fields = ("echo", "best_of", "suffix", "logit_bias")


class ContentPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant"]
    content: Optional[Union[str, list[ContentPart]]] = None

    def as_template(self) -> dict[str, str]:
        content = self.content
        if isinstance(content, list):
            content = "".join(p.text for p in content)
        return {"role": "system" if self.role == "developer" else self.role, "content": content or ""}


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage]
    max_completion_tokens: Optional[int] = Field(default=None, ge=1, le=_BIG)
    unsupported_fields = ("tools", "tool_choice", "functions", "function_call", "logit_bias", "top_logprobs",
                          "response_format")

    def token_limit(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# ----------------------------------------------------------------------------- responses


def usage(prompt_tokens: int, completion_tokens: int, blocks: int, accepted_tokens: int) -> dict:
    """OpenAI usage plus the request's speculative figures: tau = (accepted drafts + one per block) / blocks."""
    tau = (accepted_tokens + blocks) / blocks if blocks else 0.0
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "tau": tau, "blocks": blocks,
            "accepted_tokens": accepted_tokens}


def completion_body(rid: str, model: str, text: str, finish_reason: Optional[str], use: dict, chat: bool) -> dict:
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": [choice], "usage": use}


def chunk_body(rid: str, model: str, created: int, chat: bool, text: str = "", finish_reason: Optional[str] = None,
               role: bool = False, use: Optional[dict] = None) -> dict:
    """One streamed chunk: a text delta and/or a finish reason, or (use given) the final usage-only chunk."""
    body: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                            "created": created, "model": model}
    if use is not None:
        return {**body, "choices": [], "usage": use}
    if chat:
        delta = {"role": "assistant", "content": text} if role else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return {**body, "choices": [choice]}


def models_body(names: list[str], created: int) -> dict:
    return {"object": "list", "data": [{"id": n, "object": "model", "created": created, "owned_by": "lilicorr"}
                                       for n in names]}
