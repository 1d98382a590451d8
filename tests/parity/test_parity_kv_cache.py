"""Parity of the KV cache's compaction (engine/kv_cache.py `KVCache.compact`): after a tree step, the accepted path's
entries moved to consecutive positions, in every layer's K and V buffers.

Reference: `plain_compact` below, one position at a time.
Backends: on CPU the moves of every buffer in one TorchScript call (`_move_positions`, scripted: the default), and
the same moves run eagerly (`scripted=False`, what CUDA runs).
Shapes: the tiny target's cache and SmolLM2-135M's (30 layers, 3 KV heads of 64). dtypes: fp32 and bf16 (a bf16
target's cache); the moves copy values, so every backend equals the reference exactly.
"""

import pytest
import torch

from lilicorr.engine.kv_cache import KVCache

SHAPES = {"tiny": (4, 2, 16), "smollm2": (30, 3, 64)}  # (layers, KV heads, head dim)


def plain_compact(bufs, rows: slice, start, src):
    """The reference: in each buffer, row r's position start[r] + j takes what start[r] + src[r, j] held."""
    out = [b.clone() for b in bufs]
    for b, o in zip(bufs, out):
        for c, r in enumerate(range(*rows.indices(b.shape[0]))):
            for j in range(src.shape[1]):
                o[r, :, start[c] + j] = b[r, :, start[c] + src[c, j]]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("scripted", [True, False], ids=["scripted", "eager"])
def test_compaction_equals_the_plain_moves(scripted, shape, dtype):
    layers, kv_heads, hd = SHAPES[shape]
    g = torch.Generator().manual_seed(0)
    cache = KVCache(layers, 4, kv_heads, 24, hd, dtype, slack=8)
    for buf in cache.k + cache.v:
        buf.copy_(torch.randn(buf.shape, generator=g))
    rows = slice(1, 4)  # rows 1-3 of 4, at their own lengths
    start = torch.tensor([5, 0, 11])
    # accepted paths (node ids, ascending: a path's nodes sit after their parents): one overlapping its destination,
    # a chain that stays put, one that skips nodes
    src = torch.tensor([[0, 2, 4, 5], [0, 1, 2, 3], [0, 3, 6, 7]])
    before = cache.k[0].clone()
    ref = plain_compact(cache.k + cache.v, rows, start, src)
    cache.compact(rows, start, src, scripted=scripted)
    assert all(torch.equal(a, b) for a, b in zip(cache.k + cache.v, ref))
    assert not torch.equal(cache.k[0], before)  # the paths did move entries (else the check proves little)
