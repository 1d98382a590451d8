"""Training's simulated acceptance is the engine's, block by block, on the shipped drafters (issue 38's yardstick).

Validation scores a drafter by `JointModel`'s simulated acceptance (the head proposes from the teacher-forced
target states; a block accepts the prefix equal to the target's greedy tokens). If the engine fed the drafter
anything else (context positions, the anchor, the draft vocabulary, the head's inputs), a drafter could train
well and decode badly. Here both see the same tokens: the engine's greedy output, with every answer position
as an anchor; walking those anchors as the engine does (next anchor = this one + accepted + 1, the last block
cut at the token budget) must give each prompt's accepted tokens and block count exactly.
"""

import pytest
import torch

from lilicorr.config import load_config
from lilicorr.engine.requests import Request
from lilicorr.engine.systems import build_decoder

pytestmark = pytest.mark.slow

NEW_TOKENS = 32


@pytest.fixture(scope="module")
def smollm2():
    from lilicorr.bench.acceptance import benchmark_prompt_ids
    from lilicorr.platform.assets import eos_token_ids, load_target

    cfg = load_config("smollm2-135m")
    model, tok = load_target(cfg.target)
    prompts = benchmark_prompt_ids("mt-bench", tok, None, 4)
    return cfg, model, eos_token_ids(cfg.target, tok), prompts


def simulated_walk(joint, prompt: list[int], output: list[int]) -> tuple[int, int]:
    """(accepted draft tokens, blocks) of greedy decoding `output` after `prompt`, from validation's simulation."""
    ids = torch.tensor([prompt + output])
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[0, len(prompt):] = True
    anchors = torch.arange(len(prompt), ids.shape[1] - 1)[None]  # every generated token but the last
    with torch.no_grad():
        batch = joint.build_batch(ids, mask, anchors=anchors)
    accepted = joint.accepted_drafts(batch).tolist()  # (C,) per anchor: what validation counts
    generated, anchor, blocks, total = 1, 0, 0, 0  # the prefill gives the first token: the first anchor
    while generated < len(output):
        k = min(accepted[anchor], len(output) - generated - 1)  # the budget cuts the last block
        blocks, total, generated, anchor = blocks + 1, total + k, generated + k + 1, anchor + k + 1
    return total, blocks


@pytest.mark.parametrize("system", ["dflash", "lilicorr"])
def test_engine_acceptance_equals_simulated_acceptance(smollm2, system):
    from lilicorr.models.joint import JointModel
    from lilicorr.platform.shipped import shipped_checkpoint

    cfg, model, stops, prompts = smollm2
    ckpt = shipped_checkpoint("smollm2-135m", system)
    # As validation scores: the full vocabulary, the drafter in fp32 (the preset's engine runs it in bf16, which
    # flips near-tied later slots: logits move by ~0.05)
    run_cfg = load_config("smollm2-135m", ["engine.draft_vocab=0", "engine.cpu_drafter_bf16=false"])
    run_cfg.engine.max_seq_len = max(map(len, prompts)) + NEW_TOKENS + 8
    dec = build_decoder(run_cfg, model, system, checkpoint=ckpt, stop_ids=stops, max_batch=len(prompts))
    results = dec.generate([Request(i, p, max_new_tokens=NEW_TOKENS) for i, p in enumerate(prompts)])
    joint = JointModel.load_exported(ckpt, model).eval()
    engine = [(r.accepted_tokens, r.blocks) for r in results]
    simulated = [simulated_walk(joint, p, list(r.output_ids)) for p, r in zip(prompts, results)]
    assert engine == simulated
    assert sum(a for a, _ in engine) > 0  # drafts were accepted: the comparison saw more than bonus tokens
