"""Stage timers (paper Table 3) and decoding statistics (tau, per-slot acceptance, tokens/s)."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

# Paper Table 3 stage names, in order.
STAGES = ("target_verify", "draft_backbone", "lm_head", "spec_head", "accept_residual")


class StageTimers:
    """Per-stage wall time. Off by default: then `stage()` costs nothing and never synchronizes.

    On CUDA, events are recorded around each stage and read once in `summary()` (no sync inside a
    step); on CPU, perf_counter.
    """

    def __init__(self, enabled: bool = False, device: torch.device | str = "cpu"):
        self.enabled = enabled
        self.cuda = enabled and torch.device(device).type == "cuda"
        self.totals_ms: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self._events: list[tuple[str, object, object]] = []

    @contextmanager
    def stage(self, name: str):
        if not self.enabled:
            yield
            return
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((name, start, end))
        else:
            t0 = time.perf_counter()
            yield
            self.totals_ms[name] += (time.perf_counter() - t0) * 1e3
        self.counts[name] += 1

    def summary(self, blocks: int) -> dict[str, float]:
        """Milliseconds per verification block for each stage (Table 3 layout), plus the total."""
        if self._events:
            torch.cuda.synchronize()
            for name, start, end in self._events:
                self.totals_ms[name] += start.elapsed_time(end)
            self._events.clear()
        out = {f"{s}_ms": self.totals_ms.get(s, 0.0) / max(blocks, 1) for s in STAGES}
        out["per_block_ms"] = sum(out.values())
        return out


@dataclass
class DecodeStats:
    """Counters over all verification blocks of a run.

    tau (block-weighted acceptance length) = (accepted draft tokens + bonus tokens) / verification
    blocks: the paper's "total number of accepted tokens divided by the number of verification blocks".
    Each block commits its accepted drafts plus exactly one token drawn by the target (the bonus, or the
    residual sample at a rejection), so AR decoding has tau = 1.
    """

    block_size: int = 1
    blocks: int = 0
    accepted_draft: int = 0
    bonus: int = 0
    generated: int = 0  # tokens returned to callers (includes the prefill's first token)
    prefill_tokens: int = 0
    slot_accepted: list[int] = field(default_factory=list)  # [s-1]: blocks whose slot s was accepted
    slot_proposed: list[int] = field(default_factory=list)  # [s-1]: blocks that proposed slot s
    wall_s: float = 0.0
    eager_retries: int = 0  # rows run again alone and eagerly after their batch's block raised (scheduler._block)

    def __post_init__(self):
        width = max(self.block_size - 1, 0)
        self.slot_accepted = self.slot_accepted or [0] * width
        self.slot_proposed = self.slot_proposed or [0] * width

    @property
    def tau(self) -> float:
        return (self.accepted_draft + self.bonus) / self.blocks if self.blocks else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.wall_s if self.wall_s > 0 else 0.0

    def record_blocks(self, num_accepted: list[int], num_proposed: list[int]) -> None:
        for a, n in zip(num_accepted, num_proposed):
            self.blocks += 1
            self.accepted_draft += a
            self.bonus += 1
            for s in range(min(n, len(self.slot_proposed))):
                self.slot_proposed[s] += 1
                if s < a:
                    self.slot_accepted[s] += 1

    def as_dict(self) -> dict:
        return {"tau": self.tau, "tokens_per_s": self.tokens_per_s, "blocks": self.blocks,
                "accepted_draft_tokens": self.accepted_draft, "bonus_tokens": self.bonus,
                "generated_tokens": self.generated, "prefill_tokens": self.prefill_tokens,
                "wall_s": self.wall_s, "slot_accepted": list(self.slot_accepted),
                "slot_proposed": list(self.slot_proposed)}
