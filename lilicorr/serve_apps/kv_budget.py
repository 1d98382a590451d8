"""One KV-cache budget (`engine.kv_cache_gb`) shared by the systems a Serve replica runs side by side.

Every served system owns a static cache (the target's K/V, plus its drafter's context K/V) sized
slots x (max_seq_len + slack). Three systems at Table 4 sizes (32 x 8,192 on Qwen3-8B) would want about
3 x 40 GiB, more than an 80 GB card holds beside the target. With a budget, every system keeps
`engine.max_seq_len` (the context the API promises) and gets the same number of slots: the most, up to
`engine.max_batch_size`, whose caches together fit. Fewer slots only queue requests longer; a shorter
context would refuse them. When not even one slot of each fits, the error names the fields that fix it.
"""

from __future__ import annotations

from typing import Optional

from lilicorr.config import ConfigError

GIB = 2 ** 30


class KVBudgetError(ConfigError):
    """engine.kv_cache_gb cannot hold one slot of every served system."""


def fit_slots(per_slot: dict[str, int], kv_cache_gb: Optional[float], max_batch_size: int, max_seq_len: int) -> int:
    """Slots per system so that sum(per_slot) x slots <= the budget; max_batch_size without a budget.

    per_slot: {system: K/V bytes of one slot at max_seq_len} (DecoderParts.cache_bytes_per_slot).
    """
    if kv_cache_gb is None:
        return max_batch_size
    if kv_cache_gb <= 0:
        raise KVBudgetError(f"engine.kv_cache_gb={kv_cache_gb} must be > 0 (or none for no budget)")
    budget = int(round(kv_cache_gb * GIB))  # to the byte, so that a budget written as N / 2**30 is exactly N
    one_each = sum(per_slot.values())
    slots = min(max_batch_size, budget // one_each)
    if slots < 1:
        parts = ", ".join(f"{name} {n / GIB:.3f} GiB" for name, n in per_slot.items())
        raise KVBudgetError(
            f"engine.kv_cache_gb={kv_cache_gb} ({budget} bytes) does not hold one slot of each served system at "
            f"engine.max_seq_len={max_seq_len}: one slot each needs {one_each} bytes ({parts}); raise "
            f"engine.kv_cache_gb, lower engine.max_seq_len, or serve fewer systems "
            f"(engine.max_batch_size={max_batch_size} is already cut to what fits)")
    return slots
