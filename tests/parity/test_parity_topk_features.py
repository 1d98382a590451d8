"""Parity of the vocabulary top-K + log-softmax (kernels/topk_logsoftmax.py): each drafted slot's K candidates, their
log-probabilities under the full softmax and the five confidence features (App. A).

Reference: `plain_topk_logsoftmax` below: a stable descending sort (equal logits -> the lower id first, -0.0 folded into
+0.0), torch.log_softmax, the features written out.
Backends (engine/backend.py: `kernels`):
  reference        topk_logsoftmax_reference: training's (differentiable) and CPU inference's (engine.use_triton=false
                   or no CUDA: `topk_logsoftmax` dispatches to it), ids by topk_ids (_topk_ids_chunked)
  triton           topk_logsoftmax_triton: one fused pass (engine.use_triton), on CUDA, and on CPU through the
                   Triton interpreter (a child process: interpreted_triton.py)
and the id rankings alone: _topk_ids_chunked and its fallback for the shapes it does not take, _topk_ids_by_keys (in
row blocks too).
Shapes: small rows, SmolLM2's 49,152 columns with a draft vocabulary floored, the scale twin's (qwen3-8b-debug)
151,936; tie-heavy rows throughout. dtypes: fp32 and bf16 logits (every backend ranks fp32 values).
"""

from dataclasses import dataclass

import pytest
import torch

import lilicorr.kernels.topk_logsoftmax as tk
from interpreted_triton import NO_TRITON, TOPK_CASES, make_topk_input, outputs, params

FLOOR = torch.finfo(torch.float32).min / 4  # the engine's logit of a token outside the draft vocabulary


def plain_topk_logsoftmax(logits: torch.Tensor, k: int) -> tk.TopKLogProbs:
    """The reference: the K largest logits in order (a stable sort keeps equal ones in id order), their log-softmax,
    and the features [logprob, prob, logprob - top logprob, rank / (K - 1), is top]."""
    x = logits.float() + 0.0  # -0.0 == +0.0 for the sort already; + 0.0 makes their log-softmax bits equal too
    ids = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :k]
    lp = torch.log_softmax(x, dim=-1).gather(1, ids)
    rank = torch.arange(k, device=x.device, dtype=torch.float32).expand_as(lp)
    rank_frac = rank / (k - 1) if k > 1 else torch.zeros_like(rank)
    return tk.TopKLogProbs(ids, lp, torch.stack([lp, lp.exp(), lp - lp[:, :1], rank_frac, (rank == 0).float()], -1))


# Tolerance per backend: the CPU backends run the reference's own log_softmax on the same values, so they equal it
# bit for bit; Triton computes the max and the sum of exponentials online in another order (~1 ulp of fp32 logits).
EXACT = "exact"
TRITON_TOL = dict(rtol=1e-5, atol=1e-5)


def assert_matches(got: tk.TopKLogProbs, ref: tk.TopKLogProbs, tol):
    assert torch.equal(got.ids, ref.ids)  # ids exact for every backend: ties are decided by id
    if tol == EXACT:
        assert torch.equal(got.logprobs, ref.logprobs) and torch.equal(got.features, ref.features)
    else:
        torch.testing.assert_close(got.logprobs, ref.logprobs, **tol)
        torch.testing.assert_close(got.features, ref.features, **tol)


# ---------------------------------------------------------------- shapes
def _tied(levels: int, n: int, v: int, seed: int) -> torch.Tensor:
    """Tie-heavy rows: few distinct values, negatives, -0.0 beside +0.0, a floored tail (outside a draft vocab)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-levels, levels, (n, v), generator=g).float() / 7
    x[::5, v // 3:] = FLOOR
    x[1::7] = -0.0
    x[2::7, ::3] = 0.0
    return x


def _drafter_logits(v: int, rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Logits like the engine's: a draft vocabulary's columns, the rest at the floor; random and tied tops."""
    g = torch.Generator().manual_seed(seed)
    x = torch.full((rows, v), FLOOR)
    cols = torch.randperm(v, generator=g)[:vocab]
    x[:, cols] = torch.randn(rows, vocab, generator=g) * 4
    x[3, cols[:5]] = 20.0  # a five-way tie at the top
    x[4] = torch.randn(v, generator=g).round()  # many ties
    return x


def _random(n: int, v: int, seed: int) -> torch.Tensor:
    x = torch.randn(n, v, generator=torch.Generator().manual_seed(seed)) * 3
    x[0, 5] = x[0, 9] = 10.0  # a tie at the top: the lower id first
    return x


@dataclass(frozen=True)
class Shape:
    name: str
    make: object  # () -> (N, V) fp32 logits
    ks: tuple


SHAPES = [Shape("small-4x1000", lambda: _random(4, 1000, 0), (1, 4, 16)),
          Shape("tied-41x2560", lambda: _tied(17, 41, 64 * 40, 17), (1, 4, 7, 40)),
          Shape("tied-9x1000", lambda: _tied(17, 9, 1000, 0), (4,)),  # V % 64 != 0: the chunked ids fall back
          Shape("tied-9x128", lambda: _tied(17, 9, 128, 1), (5,)),  # 2 chunks < K: the chunked ids fall back
          Shape("smollm2-14x49152", lambda: _drafter_logits(49152, 14, 8192, 3), (4,)),  # the shipped drafters
          Shape("twin-15x151936", lambda: _random(15, 151936, 5), (8,))]  # qwen3-8b-debug: S = 15, K = 8
DTYPES = [torch.float32, torch.bfloat16]


# ---------------------------------------------------------------- CPU backends
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_topk_logsoftmax_reference_equals_the_plain_reference(shape, dtype, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the dispatch below must take the CPU path
    x = shape.make().to(dtype)
    for k in shape.ks:
        ref = plain_topk_logsoftmax(x, k)
        assert_matches(tk.topk_logsoftmax_reference(x, k), ref, EXACT)
        with torch.no_grad():  # the dispatch: the same path on CPU
            assert_matches(tk.topk_logsoftmax(x, k), ref, EXACT)


def _by_keys_in_row_blocks(x, k):
    from unittest import mock

    with mock.patch.object(tk, "KEY_ELEMENTS", 3 * x.shape[1]):  # blocks of 3 rows
        return tk._topk_ids_by_keys(x + 0.0, k)


IDS = {"chunked": tk._topk_ids_chunked,
       "by_keys": lambda x, k: tk._topk_ids_by_keys(x + 0.0, k),
       "by_keys-row_blocks": _by_keys_in_row_blocks}


@pytest.mark.parametrize("levels", [2, 3, 17, 1000, 1 << 20])
@pytest.mark.parametrize("backend", list(IDS))
def test_topk_ids_equal_the_stable_sort_on_tied_rows(backend, levels):
    """Tie-heavy rows (few distinct values, negatives, -0.0 beside +0.0, a floored tail): every ranking gives the
    stable sort's ids, up to K as many as the row has chunks; row blocks of 3 rows give one pass's ids."""
    for n, v, ks in [(41, 64 * 40, (1, 4, 7, 40)), (64, 500, (1, 4, 16, 450))]:
        x = _tied(levels, n, v, levels)
        for k in ks:
            assert torch.equal(IDS[backend](x, k), plain_topk_logsoftmax(x, k).ids), (n, v, k)
    assert IDS[backend](x[:0], 4).shape == (0, 4)  # an empty batch too


# ---------------------------------------------------------------- Triton
@NO_TRITON
def test_import_does_not_pull_triton():
    """The interpreter's child imported lilicorr.kernels without triton, ray, deepspeed or mlflow."""
    assert outputs(slow=False)["heavy_imports"].item() == 0


@NO_TRITON
@pytest.mark.parametrize("case", params(TOPK_CASES))
def test_triton_interpreted_equals_the_plain_reference(case):
    out = outputs(case.slow)
    ref = plain_topk_logsoftmax(make_topk_input(case), case.k)
    got = tk.TopKLogProbs(out[f"{case.name}/ids"], out[f"{case.name}/logprobs"], out[f"{case.name}/features"])
    assert_matches(got, ref, TRITON_TOL)
    assert_matches(got, tk.topk_logsoftmax_reference(make_topk_input(case), case.k), TRITON_TOL)
    if f"{case.name}/dispatch_ids" in out:  # the public dispatch took the same path
        assert torch.equal(out[f"{case.name}/dispatch_ids"], ref.ids)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n", [15, 480])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("k", [1, 8, 16])
def test_triton_on_gpu_equals_the_plain_reference(n, dtype, k):
    """The paper's Table 4 sizes (Qwen3's 151,936 columns) through the dispatch on CUDA tensors."""
    g = torch.Generator(device="cuda").manual_seed(n * k)
    x = (3 * torch.randn(n, 151936, device="cuda", generator=g)).to(dtype)
    x[0, :1000] = 2.0  # a block of exact ties at the top
    x[1, ::3] = float("-inf")
    got = tk.topk_logsoftmax(x, k)
    assert_matches(got, plain_topk_logsoftmax(x, k), TRITON_TOL)
    assert_matches(got, tk.topk_logsoftmax_reference(x, k), TRITON_TOL)
