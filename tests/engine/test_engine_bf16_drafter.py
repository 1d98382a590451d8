"""engine.cpu_drafter_bf16: an fp32 CPU target with its drafter in bf16 (oneDNN's bf16 GEMMs) stays lossless
for every system, and the drafter, its context cache and packed layers really are bf16 while the heads and
the target stay fp32. (That a trained bf16 drafter still drafts: tests/models/test_shipped_drafters.py.)"""

import pytest
import torch

from engine_helpers import tiny_config, varied_random_target
from lilicorr.engine.requests import Request
from lilicorr.engine.systems import build_decoder
from lilicorr.kernels.packed_linear import bf16_supported

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.skipif(not bf16_supported(), reason="no native bf16 in oneDNN on this CPU")]


@pytest.mark.parametrize("system", ["dflash", "lilicorr", "ddtree", "domino", "dspark"])
def test_bf16_drafter_decodes_the_targets_greedy_output(system, monkeypatch):
    from lilicorr.kernels import packed_linear

    monkeypatch.setattr(packed_linear, "MIN_ELEMENTS", 0)  # the tiny drafter's layers pack as real ones do
    cfg = tiny_config("llama", overrides=["engine.cpu_drafter_bf16=true"])
    model = varied_random_target(cfg, seed=11)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, cfg.target.vocab_size, (n,), generator=g).tolist() for n in (3, 9, 1)]
    refs = [model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                           pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    dec = build_decoder(cfg, model, system, max_batch=2)
    d = dec.runner.drafting
    assert next(d.drafter.parameters()).dtype == torch.bfloat16 and d.ctx_cache.k[0].dtype == torch.bfloat16
    packed = d.drafter_fast.packed.values()  # the decoder's packed copies of the drafter's projections, bf16
    assert packed and all(p.weight.dtype == torch.bfloat16 for p in packed)
    assert all(p.dtype == torch.float32 for p in d.head.parameters())
    results = dec.generate([Request(i, p, max_new_tokens=12) for i, p in enumerate(prompts)])
    assert [r.output_ids for r in results] == refs
    assert all(r.error is None for r in results)


def test_the_flag_leaves_a_bf16_target_alone():
    cfg = tiny_config("llama", overrides=["engine.cpu_drafter_bf16=true", "target.dtype=bfloat16"])
    model = varied_random_target(cfg, seed=11).to(torch.bfloat16)
    dec = build_decoder(cfg, model, "dflash", max_batch=1)
    assert next(dec.runner.drafting.drafter.parameters()).dtype == torch.bfloat16  # the target's dtype
    assert not dec.runner.drafting.drafter_fast.packed  # the target's fp32-only rule: nothing packed
