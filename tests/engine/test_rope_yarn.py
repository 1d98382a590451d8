"""RoPE in our target forward: scaled variants (YaRN for Qwen3) against transformers' own rotary embedding."""

import pytest
import torch

from lilicorr.engine.rope import RopeTable, apply_rope, cos_sin, inv_freq_for, rope_parameters
from lilicorr.engine.target_forward import TargetForward

SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    "yarn-mscale": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "mscale": 0.9,
                    "mscale_all_dim": 0.7, "beta_fast": 16, "beta_slow": 2, "truncate": False},
}


def _tiny(arch: str, scaling, theta: float = 10000.0):
    from transformers import LlamaConfig, Qwen3Config

    cls = Qwen3Config if arch == "qwen3" else LlamaConfig
    common = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=128)
    try:  # transformers 5.x: rope_parameters holds theta and scaling
        cfg = cls(**common, rope_parameters={"rope_type": "default", "rope_theta": theta, **(scaling or {})})
    except TypeError:  # transformers 4.x
        cfg = cls(**common, rope_theta=theta, rope_scaling=scaling)
    return cfg


def _hf_model(cfg, seed=0):
    from transformers import LlamaForCausalLM, Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = (Qwen3ForCausalLM if cfg.model_type == "qwen3" else LlamaForCausalLM)(cfg).eval()
    with torch.no_grad():  # weights ~ N(0, 1/fan_in) so logits carry the positions' effect
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape) / p.shape[1] ** 0.5)
    return model


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_inverse_frequencies_and_scale_equal_transformers(kind):
    model = _hf_model(_tiny("qwen3", SCALINGS[kind], theta=1e6 if kind.startswith("yarn") else 1e4))
    rotary = model.model.rotary_emb
    inv, scale = rope_parameters(model.config)
    assert torch.equal(inv, rotary.inv_freq.float()), kind
    assert scale == pytest.approx(float(rotary.attention_scaling), rel=1e-12)
    if kind.startswith("yarn"):
        assert scale > 1.0 and not torch.equal(inv, inv_freq_for(1e6, 16)[0])  # the scaling did something


def test_cos_sin_and_table_rotation_equal_transformers():
    model = _hf_model(_tiny("qwen3", SCALINGS["yarn"]))
    pos = torch.tensor([[0, 5, 31, 32, 100, 127]])
    x = torch.randn(1, 6, 16)
    ref_cos, ref_sin = model.model.rotary_emb(x, pos)
    inv, scale = rope_parameters(model.config)
    cos, sin = cos_sin(pos, inv, scale)
    assert torch.equal(cos, ref_cos) and torch.equal(sin, ref_sin)
    table = RopeTable(inv, scale, torch.float32, "cpu")
    table.ensure(128)
    tc, ts = table.lookup(pos)
    q = torch.randn(1, 6, 3, 16)  # (C, T, heads, hd)
    want = apply_rope(q, cos[:, :, None], sin[:, :, None])
    got = q * tc[:, :, None] + q.roll(8, dims=-1) * ts[:, :, None]
    assert torch.equal(got, want)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_yarn_target_logits_match_transformers_past_the_original_window(arch):
    """80 tokens with original_max_position_embeddings=32: prefill, AR steps and a block all past 32."""
    model = _hf_model(_tiny(arch, SCALINGS["yarn"]), seed=1)
    ids = torch.randint(0, 256, (2, 80), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids).logits
    tf = TargetForward(model)
    cache = tf.new_cache(2, 96)
    outs = []
    for a, b in [(0, 40), (40, 41), (41, 42), (42, 80)]:
        outs.append(tf(ids[:, a:b], cache, slice(0, 2), kv_len=b).logits)
        cache.lens[:2] += b - a
    assert (torch.cat(outs, 1) - ref).abs().max() < 1e-4
    default = _hf_model(_tiny(arch, None), seed=1)  # same weights, no scaling: the logits differ past 32
    with torch.no_grad():
        assert (default(ids).logits[:, 40:] - ref[:, 40:]).abs().max() > 1e-2


def test_unsupported_rope_type_is_a_clear_error():
    with pytest.raises(ValueError, match="rope type 'dynamic' is not supported"):
        inv_freq_for(1e4, 16, {"rope_type": "dynamic", "factor": 2.0})
