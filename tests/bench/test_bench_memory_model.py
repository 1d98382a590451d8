"""The Qwen3-8B memory model (jobs/bench.py train-memory): its parameter counts against hand-computed ones and its
arithmetic against the shapes, so the README's per-GPU figure rests on numbers that can be checked."""

import pytest

from lilicorr.bench.memory_model import estimate, largest_micro_batch, qwen3_8b_config, trainable_params


def test_parameter_counts_at_qwen3_8b():
    cfg = qwen3_8b_config()
    drafter, head = trainable_params(cfg)
    per_layer = (4096 * 4096 * 2 + 4096 * 1024 * 2) + 3 * 4096 * 12288 + (2 * 4096 + 2 * 128)  # attn, SwiGLU, norms
    fc, norms, mask = 5 * 4096 * 4096, 2 * 4096, 4096  # fusion over 5 captured layers, hidden/final norm, learned mask
    assert drafter == 5 * per_layer + fc + norms + mask == 1_048_630_528  # docs/design.md §9: "~1.05B"
    # the LiLiCorr head of Table 4 (36.76M; heads/lilicorr.py's count with target="fused" and one shared bias table)
    assert head == 36_758_778


def test_estimate_terms_from_the_shapes():
    est = estimate(qwen3_8b_config(), "lilicorr", world=8)
    target = 36 * (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 12288 + 2 * 4096 + 2 * 128) + 2 * 151936 * 4096 + 4096
    assert target == 8_190_735_360  # Qwen3-8B
    assert est.parts_gb["target weights (bf16)"] == round(target * 2 / 1e9, 2)
    P = 1_048_630_528 + 36_758_778
    assert est.parts_gb["optimizer: fp32 master + Adam m, v + fp32 grads / world (ZeRO-2)"] == round(16 * P / 8 / 1e9, 2)
    assert est.parts_gb["loss chunk (transient)"] == round(2048 * 151936 * 12 / 1e9, 2)
    assert est.total_gb == pytest.approx(sum(est.parts_gb.values()))
    two = estimate(qwen3_8b_config(), "lilicorr", world=8, micro_batch=2)
    per_seq = two.total_gb - est.total_gb  # what one more sequence adds: activations and the target pass only
    assert per_seq == pytest.approx(est.parts_gb["drafter activations"] + est.parts_gb["head activations"]
                                    + est.parts_gb["target pass (no grad, transient)"], abs=0.02)
    micro = largest_micro_batch(qwen3_8b_config(), "lilicorr", world=8)
    assert estimate(qwen3_8b_config(), "lilicorr", 8, micro).total_gb <= 76 < estimate(
        qwen3_8b_config(), "lilicorr", 8, micro + 1).total_gb
