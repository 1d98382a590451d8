"""One-call generation for callers that just want token ids (regeneration, evaluation scripts).

    from lilicorr.engine.simple import generate_ids
    outs = generate_ids(hf_model, prompts, max_new_tokens=128, stop_ids=[eos])  # greedy AR, batched

Greedy output equals the target's own greedy continuation (stop id included when hit), whatever the
batch size: rows never pad each other (per-row cache lengths, right-padded prefill).
"""

from __future__ import annotations

from typing import Optional, Sequence

from lilicorr.config import Config, EngineConfig


def generate_ids(hf_model, prompts: Sequence[Sequence[int]], max_new_tokens: int, stop_ids: Sequence[int] = (),
                 system: str = "ar", cfg: Optional[Config] = None, checkpoint: Optional[str] = None,
                 max_batch: int = 8, temperature: float = 0.0, seed: int = 0) -> list[list[int]]:
    """[generated ids] per prompt. Raises ValueError naming the first bad prompt (empty, too long)."""
    from .requests import Request
    from .systems import build_decoder

    cfg = cfg or Config()
    cfg.engine = EngineConfig(**{**cfg.engine.__dict__})
    longest = max((len(p) for p in prompts), default=1)
    cfg.engine.max_seq_len = max(cfg.engine.max_seq_len, longest + max_new_tokens + 1)
    cfg.engine.max_new_tokens, cfg.engine.temperature, cfg.engine.seed = max_new_tokens, temperature, seed
    dec = build_decoder(cfg, hf_model, system, checkpoint=checkpoint, stop_ids=stop_ids,
                        max_batch=max(1, min(max_batch, len(prompts))))
    results = dec.generate([Request(i, list(p)) for i, p in enumerate(prompts)])
    bad = next((r for r in results if r.error), None)
    if bad is not None:
        raise ValueError(bad.error)
    return [r.output_ids for r in results]
