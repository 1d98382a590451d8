"""A block never reads the device until its end: no .item(), bool/int/float of a tensor, and exactly one
.tolist() (the block's packed result) per block, for every kind of proposal (issue 15, item 3)."""

from collections import Counter

import pytest
import torch

from engine_helpers import tiny_config, varied_random_target
from lilicorr.engine.requests import Request
from lilicorr.engine.systems import build_decoder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

READS = ["item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy"]


@pytest.fixture(scope="module")
def model():
    cfg = tiny_config("llama")
    return cfg, varied_random_target(cfg, seed=11)


@pytest.mark.parametrize("system", ["ar", "dflash", "lilicorr", "dspark-sampled", "ddtree"])
def test_one_device_read_per_block(model, system, monkeypatch):
    cfg, m = model
    dec = build_decoder(cfg, m, system, max_batch=3)
    counts, inside, blocks = Counter(), [False], [0]
    for name in READS:
        orig = getattr(torch.Tensor, name)

        def counted(self, *a, _orig=orig, _name=name, **kw):
            if inside[0]:
                counts[_name] += 1
            return _orig(self, *a, **kw)
        monkeypatch.setattr(torch.Tensor, name, counted)
    run_block = dec.runner.run_block

    def watched(*a, **kw):
        inside[0] = True
        blocks[0] += 1
        try:
            return run_block(*a, **kw)
        finally:
            inside[0] = False
    monkeypatch.setattr(dec.runner, "run_block", watched)
    g = torch.Generator().manual_seed(1)
    reqs = [Request(i, torch.randint(0, 512, (3 + 2 * i,), generator=g).tolist(), max_new_tokens=9,
                    temperature=[0.0, 1.0, 0.7][i % 3], seed=i) for i in range(5)]
    res = dec.generate(reqs)
    assert all(r.error is None and len(r.output_ids) == 9 for r in res)
    assert blocks[0] > 3
    assert dict(counts) == {"tolist": blocks[0]}
