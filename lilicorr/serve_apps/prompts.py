"""Request bodies -> prompt token ids and the engine request, with every client mistake a 4xx naming it.

Completions: `prompt` as text (tokenized without special tokens, as `jobs/generate.py` does for raw
prompts) or as token ids; a list of one prompt is unwrapped, more than one is refused (one choice per
request). Chat: the target's chat template through `lilicorr.platform.chat.prompt_ids`, exactly the
prompt `jobs/generate.py` builds for a `messages` row.
"""

from __future__ import annotations

import uuid
from typing import Union

from lilicorr.engine.requests import Request

from .errors import APIError
from .generation import ServedModel
from .protocol import ChatCompletionRequest, CompletionRequest

CHARS_PER_TOKEN_BOUND = 32  # a prompt this many characters per cache token is over-long before tokenizing


def _encode(tokenizer, text: str, model: ServedModel, param: str) -> list[int]:
    if len(text) > CHARS_PER_TOKEN_BOUND * model.max_seq_len:
        raise APIError(400, f"{param} of {len(text)} characters is far over the model's context of "
                            f"{model.max_seq_len} tokens", param, "context_length_exceeded")
    try:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    except Exception as e:  # e.g. lone surrogates the tokenizer cannot encode
        raise APIError(400, f"{param} could not be tokenized: {type(e).__name__}", param, "invalid_value") from None


def completion_prompt(body: CompletionRequest, tokenizer, model: ServedModel) -> list[int]:
    prompt: Union[str, list] = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise APIError(400, f"one prompt per request (got {len(prompt)})", "prompt", "invalid_value")
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = _encode(tokenizer, prompt, model, "prompt") if prompt else []
    else:
        ids = [int(t) for t in prompt]
        bad = [t for t in ids if not 0 <= t < model.vocab_size]
        if bad:
            raise APIError(400, f"token id {bad[0]} outside the vocabulary (size {model.vocab_size})", "prompt",
                           "invalid_value")
    if not ids:
        raise APIError(400, "prompt is empty", "prompt", "invalid_value")
    return ids


def chat_prompt(body: ChatCompletionRequest, tokenizer, model: ServedModel, enable_thinking: bool) -> list[int]:
    from lilicorr.platform.chat import prompt_ids, render

    if not body.messages:
        raise APIError(400, "messages is empty", "messages", "invalid_value")
    messages = [m.as_template() for m in body.messages]
    chars = sum(len(m["content"]) for m in messages)
    if chars > CHARS_PER_TOKEN_BOUND * model.max_seq_len:
        raise APIError(400, f"messages of {chars} characters are far over the model's context of "
                            f"{model.max_seq_len} tokens", "messages", "context_length_exceeded")
    try:
        render(tokenizer, messages, enable_thinking)
    except Exception as e:  # the template refuses this conversation (e.g. role order)
        raise APIError(400, f"messages do not fit the model's chat template: {type(e).__name__}: {e}",
                       "messages", "invalid_value") from None
    try:
        ids = prompt_ids(tokenizer, messages, enable_thinking)
    except Exception as e:
        raise APIError(400, f"messages could not be tokenized: {type(e).__name__}", "messages",
                       "invalid_value") from None
    return ids


def engine_request(body: Union[CompletionRequest, ChatCompletionRequest], ids: list[int],
                   model: ServedModel) -> tuple[Request, tuple[str, ...]]:
    """The engine's request (None = the engine's setting) and the stop strings, with the prompt and token limit
    checked against the model's context."""
    body.check_supported()
    stops = tuple(body.stops())
    n_prompt = len(ids)
    room = model.max_seq_len - n_prompt
    if room < 1:
        raise APIError(400, f"prompt of {n_prompt} tokens does not fit the model's context of {model.max_seq_len} "
                            f"tokens (at least one token must be generated)", "prompt", "context_length_exceeded")
    limit = body.token_limit() if isinstance(body, ChatCompletionRequest) else body.max_tokens
    if limit is not None and limit > room:
        param = "max_tokens" if body.max_tokens is not None else "max_completion_tokens"
        raise APIError(400, f"{param}={limit} with a prompt of {n_prompt} tokens exceeds the model's context of "
                            f"{model.max_seq_len} tokens (at most {room})", param, "context_length_exceeded")
    top_k = body.top_k if body.top_k is not None and body.top_k > 0 else None
    return Request(uuid.uuid4().hex, list(ids), max_new_tokens=limit, temperature=body.temperature, seed=body.seed,
                   top_p=body.top_p, top_k=top_k), stops
