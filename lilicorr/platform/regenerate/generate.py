"""Greedy generation for regeneration: the engine's batched autoregressive decoder, or transformers.

A `GreedyGenerator` is called with a list of prompts and returns, per prompt, the ids the target
generates greedily, up to and including the first stop id, at most `max_new_tokens` of them. It is
the only place regeneration touches a decoder.

Backends (`data.generate_backend`):
  - "engine": lilicorr.engine's Decoder with system "ar" — static KV cache of `data.batch_size` rows
    (per-row lengths). A call may carry more prompts than rows: the decoder's scheduler admits the
    next waiting prompt into a row as soon as one finishes (continuous batching), so rows never idle
    beside a long answer. Its greedy output equals the target's own (tests compare it with transformers).
  - "hf": transformers `generate(do_sample=False)`, one prompt at a time (exact, slow; a reference).
  - "vllm" is not one of these: its engines live in Ray Data LLM's actors, not in our generator actor, so the
    pipeline drives it from the driver (regenerate/vllm_processor.py) through the same `regenerate_rows`.
"""

from __future__ import annotations

import copy

GREEDY_BACKENDS = ("engine", "hf")  # run inside ConversationRegenerator by a GreedyGenerator (vllm: vllm_processor.py)


class GreedyGenerator:
    def __init__(self, model, tokenizer, cfg, backend: str = "engine"):
        if backend not in GREEDY_BACKENDS:
            raise ValueError(f"data.generate_backend {backend!r} is not a GreedyGenerator backend (one of "
                             f"{', '.join(GREEDY_BACKENDS)}); vllm runs through regenerate/vllm_processor.py")
        self.model, self.tokenizer, self.cfg, self.backend = model, tokenizer, cfg, backend
        self._decoder = None
        self._decoder_shape = (0, 0)  # (max_batch, max_len) of the cached decoder

    def __call__(self, prompts: list[list[int]], max_new_tokens: int, stop_ids: list[int]) -> list[list[int]]:
        if not prompts:
            return []
        if self.backend == "hf":
            return [hf_greedy(self.model, self.tokenizer, p, max_new_tokens, stop_ids) for p in prompts]
        try:
            return self._engine(prompts, max_new_tokens, stop_ids)
        except BaseException:
            self.reset()  # the caller skips this batch (actor.py); the next call must not meet its leftovers
            raise

    def reset(self) -> None:
        """Drop the decoder: a call that raised mid-way leaves requests in its slots, and after a CUDA OOM
        the cache's memory is better returned before the next (smaller or equal) one is allocated."""
        self._decoder = None
        self._decoder_shape = (0, 0)
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _engine(self, prompts, max_new_tokens, stop_ids):
        from lilicorr.engine.requests import Request

        rows = min(len(prompts), max(1, self.cfg.data.batch_size))  # the rest wait for a free row
        decoder = self._decoder_for(rows, max(len(p) for p in prompts) + max_new_tokens + 1)
        results = decoder.generate([Request(id=i, prompt_ids=list(p), max_new_tokens=max_new_tokens,
                                            temperature=0.0, stop_ids=list(stop_ids))
                                    for i, p in enumerate(prompts)])
        for r in results:
            if r.error:
                raise RuntimeError(f"engine failed on a regeneration prompt: {r.error}")
        return [list(r.output_ids) for r in results]

    def _decoder_for(self, batch: int, length: int):
        """A decoder whose static cache fits `batch` rows of `length` tokens (reused while it fits).

        Sizes are rounded up (batch to data.batch_size, length to a multiple of 256) so a run builds
        a handful of decoders, not one per call, and the cache never spans the full context needlessly.
        """
        from lilicorr.engine.systems import build_decoder

        max_batch, max_len = self._decoder_shape
        if self._decoder is not None and batch <= max_batch and length <= max_len:
            return self._decoder
        batch = max(batch, self.cfg.data.batch_size, max_batch)
        length = max(-(-length // 256) * 256, max_len)
        cfg = copy.deepcopy(self.cfg)
        cfg.engine.max_seq_len = length
        cfg.engine.max_batch_size = batch
        cfg.engine.temperature = 0.0
        self._decoder = None  # free the old cache before allocating the new one
        self._decoder = build_decoder(cfg, self.model, "ar", max_batch=batch)
        self._decoder_shape = (batch, length)
        return self._decoder


def hf_greedy(model, tokenizer, prompt: list[int], max_new_tokens: int, stop_ids: list[int]) -> list[int]:
    """transformers greedy generation of one prompt: new ids, cut after the first stop id."""
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
