"""The chunked top-k ids and topk_logsoftmax_fast (the CPU inference path) against their references, bit for bit."""

import pytest
import torch

import lilicorr.kernels.topk_logsoftmax as tk


def _rows(levels: int, n: int, v: int, seed: int) -> torch.Tensor:
    """Tie-heavy rows: few distinct values, negatives, -0.0 beside +0.0, a floored tail (outside a draft vocab)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-levels, levels, (n, v), generator=g).float() / 7
    x[::5, v // 3:] = tk.torch.finfo(torch.float32).min / 4
    x[1::7] = -0.0
    x[2::7, ::3] = 0.0
    return x


@pytest.mark.parametrize("levels", [2, 17, 1000, 1 << 20])
def test_chunked_ids_equal_the_exact_keys(levels):
    x = _rows(levels, 41, 64 * 40, levels)
    for k in (1, 4, 7, 40):  # up to as many chunks as the row has
        assert torch.equal(tk._topk_ids_chunked(x, k), tk._topk_ids_by_keys(x + 0.0, k)), k


def test_chunked_ids_fall_back_where_chunks_do_not_fit():
    x = _rows(17, 9, 1000, 0)  # 1000 % 64 != 0
    assert torch.equal(tk._topk_ids_chunked(x, 4), tk._topk_ids_by_keys(x + 0.0, 4))
    y = _rows(17, 9, 128, 1)  # 2 chunks < k
    assert torch.equal(tk._topk_ids_chunked(y, 5), tk._topk_ids_by_keys(y + 0.0, 5))
    assert tk._topk_ids_chunked(y[:0], 4).shape == (0, 4)


def test_fast_topk_logsoftmax_equals_the_reference_on_drafter_logits():
    """Logits like the engine's: a draft vocabulary's columns, the rest at the floor; random and tied tops."""
    g = torch.Generator().manual_seed(3)
    v = 49152
    x = torch.full((14, v), tk.torch.finfo(torch.float32).min / 4)
    cols = torch.randperm(v, generator=g)[:8192]
    x[:, cols] = torch.randn(14, 8192, generator=g) * 4
    x[3, cols[:5]] = 20.0  # a five-way tie at the top
    x[4] = torch.randn(v, generator=g).round()  # many ties
    a, b = tk.topk_logsoftmax_fast(x, 4), tk.topk_logsoftmax_reference(x, 4)
    assert torch.equal(a.ids, b.ids) and torch.equal(a.logprobs, b.logprobs) and torch.equal(a.features, b.features)
    c = tk.topk_logsoftmax(x, 4)  # the dispatch picks the fast form on CPU without grad
    assert torch.equal(c.ids, b.ids) and torch.equal(c.logprobs, b.logprobs)
