"""The hooks the engine offers its benchmarks (lilicorr/bench reads the engine through them, never by replacing its
methods): a DraftRunner's proposal observers, a KV cache row's length set for a measurement, and the count of rows
the scheduler retried eagerly."""

import pytest
import torch

from engine_helpers import tiny_config, varied_random_target
from lilicorr.engine.kv_cache import KVCache
from lilicorr.engine.requests import Request
from lilicorr.engine.systems import build_decoder

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model():
    cfg = tiny_config("llama", overrides=["engine.max_seq_len=64"])
    return cfg, varied_random_target(cfg, seed=2)


def test_every_proposal_reaches_the_observers_with_its_inputs_and_tokens(model):
    cfg, m = model
    dec = build_decoder(cfg, m, "dflash", max_batch=1)
    drafting = dec.runner.drafting
    seen = []
    drafting.observers.append(seen.append)
    res = dec.generate([Request(0, [5, 6, 7, 8], max_new_tokens=10)])[0]
    assert res.blocks > 0 and len(seen) == res.blocks  # one call a block: a missing hook fails here
    for call in seen:
        assert call.rows == slice(0, 1) and call.slot_logits.shape[:2] == call.slot_hidden.shape[:2]
        assert call.proposal.tokens.shape == (1, dec.block - 1)
    # the arguments it shows are propose's own: calling it again on them gives the same proposal
    last = seen[-1]
    again = drafting.propose(*last.args)
    assert torch.equal(again.tokens, last.proposal.tokens) and len(seen) == res.blocks + 1
    drafting.observers.remove(seen.append)
    dec.generate([Request(1, [9, 10], max_new_tokens=6)])
    assert len(seen) == res.blocks + 1  # removed: no longer called


def test_a_cache_rows_length_is_set_and_given_back():
    cache = KVCache(num_layers=1, max_batch=2, num_kv_heads=1, max_len=16, head_dim=4, dtype=torch.float32)
    cache.set_length(1, 7)
    assert cache.lens.tolist() == [0, 7]
    with cache.length_for(1, 12):
        assert cache.lens.tolist() == [0, 12]
    assert cache.lens.tolist() == [0, 7]
    with pytest.raises(ValueError), cache.length_for(0, 3):
        raise ValueError("a measurement that fails")
    assert cache.lens.tolist() == [0, 7]  # given back on the way out of an exception too


def test_rows_retried_eagerly_are_counted(model, monkeypatch):
    cfg, m = model
    dec = build_decoder(cfg, m, "dflash", max_batch=2)
    run_block = dec.runner.run_block
    failed = []

    def batch_fails_once(rows, longest, eager=False):  # the test's fault injection: the batched block raises once
        if not eager and not failed and rows.stop - rows.start == 2:
            failed.append(rows)
            raise RuntimeError("a failing batched block")
        return run_block(rows, longest, eager=eager)

    monkeypatch.setattr(dec.runner, "run_block", batch_fails_once)
    res = dec.generate([Request(0, [5, 6, 7], max_new_tokens=8), Request(1, [9, 10, 11], max_new_tokens=8)])
    assert failed and all(r.error is None for r in res)
    assert dec.stats.eager_retries == 2  # both rows of the failed block, each alone
