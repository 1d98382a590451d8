"""A replica's device and its one KV-cache budget: hand-computed cache bytes, the slot split and its error,
what the decoders really allocate, and the models placed where the arguments say (cuda in a GPU-only test)."""

from __future__ import annotations

import pytest
import torch

from lilicorr.config import load_config
from lilicorr.engine.kv_cache import KVCache, cache_bytes
from lilicorr.serve_apps.kv_budget import GIB, KVBudgetError, fit_slots
from lilicorr.serve_apps.loading import ServeSpec, load_state, replica_device, stop_all

# Qwen3-8B: 36 layers x 2 x 8 kv heads x 128 x bf16 = 147,456 bytes per token; its 5-layer drafter 20,480.
# At max_seq_len 8,192: a drafter system's slot holds 8,192 + 16 + 1 positions, AR's 8,192 + 1 + 1.
QWEN3_8B_SLOT = {"lilicorr": (147_456 + 20_480) * 8_209, "dflash": (147_456 + 20_480) * 8_209, "ar": 147_456 * 8_194}
# tiny-random (fp32): target 4 layers x 2 x 2 kv heads x 16 x 4 = 1,024 bytes per token, drafter 2 layers 512;
# max_seq_len 256, drafter block 4: lilicorr 1,536 x 261 positions, ar 1,024 x 258.
TINY_SLOT = {"ar": 264_192, "lilicorr": 400_896}


def test_cache_bytes_by_hand():
    assert cache_bytes(36, 8, 128, 2, 1, 1) == 147_456
    assert cache_bytes(36, 8, 128, 2, 32, 8_450) == 39_872_102_400
    cache = KVCache(num_layers=3, max_batch=2, num_kv_heads=2, max_len=10, head_dim=4, dtype=torch.bfloat16, slack=5)
    assert cache.nbytes == cache_bytes(3, 2, 4, 2, 2, 15) == 2_880  # 3 x 2 x 2 x 4 x 2 bytes x 2 slots x 15


def test_three_qwen3_systems_share_48_gib_as_12_slots_each():
    assert sum(QWEN3_8B_SLOT.values()) == 3_965_427_712
    assert fit_slots(QWEN3_8B_SLOT, 48.0, 32, 8_192) == 12  # 51,539,607,552 // 3,965,427,712
    assert fit_slots(QWEN3_8B_SLOT, None, 32, 8_192) == 32  # no budget: every system its full cache
    assert fit_slots(QWEN3_8B_SLOT, 200.0, 32, 8_192) == 32  # never more than max_batch_size
    assert fit_slots(TINY_SLOT, 3 * 665_088 / GIB, 8, 256) == 3  # a budget of exactly three slots holds three


def test_a_budget_without_room_for_one_slot_names_the_fields_that_fix_it():
    with pytest.raises(KVBudgetError) as e:
        fit_slots(QWEN3_8B_SLOT, 3.5, 32, 8_192)  # 3,758,096,384 bytes < 3,965,427,712
    msg = str(e.value)
    assert "engine.kv_cache_gb=3.5" in msg and "engine.max_seq_len=8192" in msg and "engine.max_batch_size=32" in msg
    assert "3965427712 bytes" in msg
    with pytest.raises(KVBudgetError, match="must be > 0"):
        fit_slots(TINY_SLOT, 0.0, 8, 256)


@pytest.mark.parametrize("device, num_gpus, cuda, want", [
    (None, 0, True, "cpu"), (None, 1, True, "cuda"), (None, 0.5, True, "cuda"), ("cpu", 1, True, "cpu"),
    ("cuda", 0, True, "cuda"), (None, 0, False, "cpu"),
])
def test_replica_device_follows_the_arguments(device, num_gpus, cuda, want):
    assert replica_device(device, num_gpus, cuda) == want


def test_a_gpu_replica_without_cuda_is_refused_not_run_on_the_cpu():
    with pytest.raises(RuntimeError, match="torch.cuda.is_available"):
        replica_device(None, 1, False)
    with pytest.raises(RuntimeError, match="torch.cuda.is_available"):
        replica_device("cuda", 0, False)
    with pytest.raises(ValueError, match="serve device 'tpu'"):
        replica_device("tpu", 0, True)


def _spec(gb, **kw):
    return ServeSpec(preset="tiny-random", systems=["ar", "lilicorr"], drafter="random", warmup=False,
                     torch_threads=1, overrides=[f"engine.kv_cache_gb={gb!r}"], **kw)


def test_the_parts_size_exactly_what_the_decoders_allocate():
    from lilicorr.engine.systems import decoder_from_parts, decoder_parts
    from lilicorr.platform.assets import load_target

    cfg = load_config("tiny-random")
    model, _ = load_target(cfg.target)
    for system, want in TINY_SLOT.items():
        parts = decoder_parts(cfg, model, system)
        assert parts.cache_bytes_per_slot(cfg.engine.max_seq_len) == want
        runner = decoder_from_parts(parts, cfg, max_batch=3).runner
        got = runner.cache.nbytes + (runner.drafting.ctx_cache.nbytes if runner.drafting else 0)
        assert got == 3 * want


def test_load_state_splits_the_budget_between_systems_on_the_cpu():
    state = load_state(_spec(2_000_000 / GIB))  # 2,000,000 // 665,088 = 3 slots each
    try:
        for m in state.models.values():
            dec = m.engine.decoder
            assert dec.max_batch == 3 and dec.runner.device.type == "cpu"
            assert m.max_seq_len == 256
        runner = state.models["tiny-random-lilicorr"].engine.decoder.runner
        assert next(runner.drafting.drafter.parameters()).device.type == "cpu"
    finally:
        stop_all(state.models)
    with pytest.raises(KVBudgetError, match="engine.kv_cache_gb"):
        load_state(_spec(600_000 / GIB))  # < 665,088: refused before any cache or engine thread exists


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_replica_reserving_a_gpu_serves_target_drafter_and_caches_from_cuda():
    state = load_state(ServeSpec(preset="tiny-random", systems=["ar", "lilicorr"], drafter="random", warmup=True,
                                 num_gpus=1))
    try:
        for m in state.models.values():
            runner = m.engine.decoder.runner
            assert runner.device.type == "cuda" and runner.cache.k[0].device.type == "cuda"
            if runner.drafting is not None:
                assert next(runner.drafting.drafter.parameters()).device.type == "cuda"
                assert runner.drafting.ctx_cache.k[0].device.type == "cuda"
    finally:
        stop_all(state.models)
