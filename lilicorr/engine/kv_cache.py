"""Static KV cache with one length per sequence (gpt-fast style, batched).

Every sequence (row) owns a fixed slice of one preallocated buffer per layer. A step writes its new
keys/values at `lens[row] + node` and reads positions `< lens[row]` plus the new ones allowed by the
step's mask. Accepting a different number of tokens per row is just a different `lens[row]`: nothing is
padded, nothing grows, and rejected entries beyond `lens` are simply overwritten by the next step.

The buffer has `slack` extra positions so a step of up to `slack` nodes may write past `max_len`
(the decoder never lets a committed length exceed `max_len`).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import List

import torch

from lilicorr.kernels.scripted import Scripted


def cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int, slots: int, positions: int) -> int:
    """Bytes of the K and V buffers of a KVCache: layers x 2 x kv_heads x head_dim x dtype bytes x slots x positions
    (positions = max_len + slack). What a serving budget is split by (serve_apps/kv_budget.py)."""
    return num_layers * 2 * num_kv_heads * head_dim * dtype_bytes * slots * positions


class KVCacheTooLarge(RuntimeError):
    """The static caches a decoder would allocate do not fit the device's free memory (refused before allocating,
    instead of an out-of-memory kill mid-run: CPU buffers are committed page by page as the cache fills)."""


def free_bytes(device: torch.device | str) -> int | None:
    """Free memory of `device` in bytes: CUDA's free memory, or the host's MemAvailable; None when unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_cache_fits(need: int, device: torch.device | str, what: str, fraction: float = 0.9) -> None:
    """KVCacheTooLarge naming the sizes and the fix when `need` bytes exceed `fraction` of the device's free memory."""
    free = free_bytes(device)
    if free is not None and need > fraction * free:
        gib = 2 ** 30
        raise KVCacheTooLarge(
            f"{what} need {need / gib:.2f} GiB, more than {fraction:.0%} of the {free / gib:.2f} GiB free on "
            f"{torch.device(device).type}: lower engine.max_batch_size (bench: --batch), engine.max_seq_len (the "
            f"longest prompt + new tokens), or the prompt length")


class KVCache:
    def __init__(self, num_layers: int, max_batch: int, num_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu", slack: int = 64):
        self.max_len = max_len
        self.capacity = max_len + slack
        shape = (max_batch, num_kv_heads, self.capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.lens = torch.zeros(max_batch, dtype=torch.long, device=device)  # (C_max,) committed tokens

    @property
    def nbytes(self) -> int:
        """Bytes held by the K/V buffers (equals cache_bytes of this cache's shape)."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    @property
    def max_batch(self) -> int:
        return self.k[0].shape[0]

    def set_length(self, row: int, n: int) -> None:
        """Row `row` holds `n` committed tokens: the next step reads positions < n and writes from n.

        The runner commits through its own steps; this is for code that drives a TargetForward over this cache
        itself (a benchmark's decode loop, or one pass timed at a chosen length)."""
        self.lens[row] = n

    @contextmanager
    def length_for(self, row: int, n: int):
        """Row `row` at length `n` inside the block, its own length back after it: a measurement's pass (e.g. one
        verification's worth of K/V at a long context) that leaves a live decoder's state as it found it."""
        before = int(self.lens[row])
        self.set_length(row, n)
        try:
            yield self
        finally:
            self.set_length(row, before)

    def write(self, layer: int, rows: slice, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k, v (C, n_kv, T, hd) at positions pos (C, T) of rows `rows` (a view, no copy)."""
        idx = pos[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])  # (C, n_kv, T, hd)
        self.k[layer][rows].scatter_(2, idx, k)
        self.v[layer][rows].scatter_(2, idx, v)

    def read(self, layer: int, rows: slice, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views (C, n_kv, kv_len, hd) of the first kv_len positions of `rows`."""
        return self.k[layer][rows, :, :kv_len], self.v[layer][rows, :, :kv_len]

    def copy_rows_in(self, slots: torch.Tensor, src: "KVCache", n: int) -> None:
        """Positions [0, n) of every row of `src` into rows `slots` (C,) of this cache, for every layer: a
        prefill of fresh prompts in scattered slots ran in `src`, a cache of just those rows."""
        for dst, part in zip(self.k + self.v, src.k + src.v):
            dst[slots, :, :n] = part[:, :, :n]

    def compact(self, rows: slice, start: torch.Tensor, src: torch.Tensor, scripted: bool = True) -> None:
        """Move the entries at start + src[:, j] to start + j (C, J), for every layer.

        A tree step wrote its nodes at start + node; the accepted path must become contiguous.
        A chain's path is 0, 1, 2, ... and needs no move (the decoder skips the call).
        scripted: on CPU, the moves in one TorchScript call; False: the eager moves, their reference (what CUDA runs).
        """
        src_pos = (start[:, None] + src)  # (C, J)
        dst_pos = start[:, None] + torch.arange(src.shape[1], device=src.device)[None, :]
        bufs = self.k + self.v
        r0, r1, _ = rows.indices(bufs[0].shape[0])
        # 2 x layers buffers of a few ops each: one TorchScript call on CPU (eager, a tree block paid for each op's
        # Python dispatch: docs/results.md, "CPU fast paths")
        fns = _SCRIPT.get() if scripted and src.device.type == "cpu" else None
        (fns["move"] if fns is not None else _move_positions)(bufs, r0, r1, src_pos, dst_pos)


def _move_positions(bufs: List[torch.Tensor], r0: int, r1: int, src_pos: torch.Tensor, dst_pos: torch.Tensor) -> None:
    """KVCache.compact's moves: in every buffer (B, n_kv, T, hd), rows r0:r1, positions src_pos (C, J) -> dst_pos."""
    if len(bufs) == 0:
        return
    b = bufs[0]
    src_idx = src_pos[:, None, :, None].expand(-1, b.shape[1], -1, b.shape[3])  # (C, n_kv, J, hd)
    dst_idx = dst_pos[:, None, :, None].expand(-1, b.shape[1], -1, b.shape[3])
    for buf in bufs:
        view = buf[r0:r1]
        moved = view.gather(2, src_idx)  # gather first: source and destination ranges overlap
        view.scatter_(2, dst_idx, moved)


_SCRIPT = Scripted("scripted KV compaction", "eager ops", move=_move_positions)
