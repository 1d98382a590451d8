"""Greedy generation for regeneration: one function, backed by the engine when it offers plain AR.

`generate_greedy` returns, per prompt, the ids the target generates greedily, up to and including
the first stop id, at most `max_new_tokens` of them. It is the only place regeneration touches a
decoder, so swapping the backend changes nothing else.

Backend: transformers `generate(do_sample=False)`, one prompt at a time. Batched generation with
left padding changes the float sums of every row (padding shifts positions and matmul shapes), which
can flip a near-tie argmax; one prompt at a time the result is exactly the target's own greedy
continuation, which is what the training corpus must hold. TODO(engine): route through the engine's
batched "ar" decoder once `lilicorr.engine` exposes one (see `_engine_decoder`).
"""

from __future__ import annotations

from typing import Optional


def generate_greedy(model, tokenizer, prompts: list[list[int]], max_new_tokens: int,
                    stop_ids: list[int]) -> list[list[int]]:
    """[generated ids] per prompt: greedy, stop id included when hit, len <= max_new_tokens."""
    decoder = _engine_decoder(model, tokenizer)
    if decoder is not None:
        return decoder(prompts, max_new_tokens, stop_ids)
    return [_hf_greedy(model, tokenizer, p, max_new_tokens, stop_ids) for p in prompts]


def _engine_decoder(model, tokenizer) -> Optional[object]:
    """The engine's batched autoregressive decoder, when the engine has one (None otherwise)."""
    return None


def _hf_greedy(model, tokenizer, prompt: list[int], max_new_tokens: int, stop_ids: list[int]) -> list[int]:
    import torch

    device = next(model.parameters()).device
    ids = torch.tensor([prompt], dtype=torch.long, device=device)  # (1, P)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=list(stop_ids), pad_token_id=pad,
                             temperature=None, top_p=None, top_k=None)
    new = out[0, len(prompt):].tolist()
    stops = set(stop_ids)
    for i, t in enumerate(new):  # generate pads after a stop only in batches; cut defensively
        if t in stops:
            return new[:i + 1]
    return new
