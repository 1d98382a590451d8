"""What callers hand the decoder and what they get back: Request in; Delta per step, Result when done."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class Request:
    id: Any
    prompt_ids: list[int]
    max_new_tokens: Optional[int] = None  # None = the engine's
    temperature: Optional[float] = None  # None = the engine's; 0 = greedy
    seed: Optional[int] = None  # None = derived from the engine seed and arrival order
    stop_ids: Optional[list[int]] = None  # None = the decoder's (the tokenizer's EOS ids)
    top_p: Optional[float] = None  # None = the engine's; in (0, 1], 1 = off
    top_k: Optional[int] = None  # None = the engine's; 0 = off


@dataclass
class Result:
    id: Any
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str = ""  # "stop" | "length" | "abort" | "error"
    blocks: int = 0  # verification blocks (target passes after the prefill)
    accepted_tokens: int = 0  # accepted draft tokens over all blocks
    error: Optional[str] = None
    index: int = -1  # arrival order in its decoder (generate() returns results in input order)

    def as_row(self) -> dict:
        row = {"id": self.id, "prompt_ids": self.prompt_ids, "output_ids": self.output_ids,
               "blocks": self.blocks, "accepted_tokens": self.accepted_tokens, "finish_reason": self.finish_reason}
        if self.error is not None:
            row["error"] = self.error
        return row


@dataclass
class Delta:
    """What one step did for one request: the tokens it gained, and whether it is done."""

    id: Any
    new_ids: list[int]
    finished: bool
    finish_reason: Optional[str] = None  # "stop" | "length" | "abort" | "error" when finished
    result: Optional[Result] = None  # set when finished


class RequestError(ValueError):
    """A request the decoder cannot run; the message names the request and the reason."""


class QueueFull(RuntimeError):
    """The waiting queue holds engine.max_waiting requests: try again later (a server answers 429)."""
