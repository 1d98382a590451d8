"""transformers `generate` as a peer at batch 1, timed the way ours is (the GPU script's HF rows). Two things
make a naive measurement wrong, both fixed here:
- With `cache_implementation="static"` transformers sizes the static cache to prompt + max_new_tokens
  and compiles the forward (CUDA graphs of inductor's "reduce-overhead") for those shapes. A warm-up with
  another max_new_tokens or prompt length rebuilds the cache and recompiles inside the timed call
  (~60 s on an H200 for Qwen3-8B): the warm-up here is the very same call, and the recompiles that still
  happen in the timed call are counted (`recompiles_in_timed_call`, Dynamo's own counter).
- Our figures start the clock after the prefill; so does this one: a streamer's second `put` (the first
  is the prompt) is the first generated token on the host, i.e. the end of the prefill. `generate` copies
  every token to the host for the streamer, a sync it already pays for its own stop check on CUDA.
"""

from __future__ import annotations

import time

import torch


class _TokenClock:
    """A transformers streamer that only notes when tokens reach the host."""

    def __init__(self):
        self.puts, self.t0, self.first, self.last = 0, 0.0, None, None

    def put(self, value) -> None:
        self.puts += 1
        now = time.perf_counter()
        if self.puts == 2:  # put 1 is the prompt, put 2 the prefill's token
            self.first = now
        self.last = now

    def end(self) -> None:
        self.last = time.perf_counter()


def _dynamo_frames() -> int:
    """Frames Dynamo has compiled in this process (its own counter; 0 where the counter is not there)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001 - a private counter: absent in some builds, then no count
        return 0


def hf_decode_tps(model, prompt: list[int], new_tokens: int, static: bool, attn: str = "sdpa") -> dict:
    """Decode tokens/s of transformers `generate` (greedy, batch 1) after the prefill, on `model`'s device.

    The warm-up is the same call as the timed one (same prompt, max_new_tokens, cache implementation,
    attention). Returns tps, the tokens timed, each call's wall time and the recompiles in the timed call.
    """
    dev = next(model.parameters()).device
    ids = torch.tensor([prompt], device=dev)
    kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                  min_new_tokens=new_tokens, do_sample=False, temperature=None, top_p=None, top_k=None,
                  pad_token_id=0)
    if static:
        kwargs["cache_implementation"] = "static"
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    old_attn = model.config._attn_implementation
    model.config._attn_implementation = attn

    def call():
        clock = _TokenClock()
        sync()
        clock.t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**kwargs, streamer=clock)
        sync()
        return out.shape[1] - ids.shape[1], clock, time.perf_counter() - clock.t0

    try:
        _, _, warm_s = call()
        frames = _dynamo_frames()
        n, clock, wall_s = call()
        recompiles = _dynamo_frames() - frames
    finally:
        model.config._attn_implementation = old_attn
    if clock.first is None or n < 2:
        raise RuntimeError(f"generate returned {n} tokens: nothing to time after the prefill")
    return {"tok_s": (n - 1) / (clock.last - clock.first), "new_tokens": n, "warmup_call_s": warm_s,
            "timed_call_s": wall_s, "prefill_s": clock.first - clock.t0, "attn": attn,
            "recompiles_in_timed_call": recompiles}
