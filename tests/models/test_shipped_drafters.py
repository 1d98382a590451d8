"""The shipped SmolLM2 drafters (checkpoints/smollm2-135m/): they load as the preset's default, decode
exactly the target's greedy output, and actually draft (slow: real SmolLM2)."""

import copy
import json

import pytest
import torch

from lilicorr.config import load_config
from lilicorr.engine.requests import Request
from lilicorr.engine.systems import build_decoder
from lilicorr.platform.shipped import shipped_checkpoint

pytestmark = pytest.mark.slow

QUESTIONS = ["Explain in two sentences why the sky is blue.", "Write a Python function that reverses a string."]


@pytest.fixture(scope="module")
def smollm2():
    from lilicorr.platform.assets import eos_token_ids, load_target
    from lilicorr.platform.chat import prompt_ids

    cfg = load_config("smollm2-135m")
    model, tok = load_target(cfg.target)
    stops = eos_token_ids(cfg.target, tok)
    prompts = [prompt_ids(tok, [{"role": "user", "content": q}], False) for q in QUESTIONS]
    refs = []
    for p in prompts:
        out = model.generate(torch.tensor([p]), max_new_tokens=32, do_sample=False, eos_token_id=stops,
                             pad_token_id=stops[0])
        refs.append(out[0, len(p):].tolist())
    return cfg, model, stops, prompts, refs


@pytest.mark.parametrize("system,bf16", [("dflash", False), ("lilicorr", False), ("lilicorr-viterbi", False),
                                         ("ddtree", False), ("dflash", True), ("lilicorr", True)])
def test_shipped_drafter_is_lossless_and_drafts(smollm2, system, bf16):
    """bf16: the drafter in bf16 on the fp32 target (engine.cpu_drafter_bf16, the preset's default where the CPU
    has native bf16) still drafts what gets accepted; False: the drafter in fp32."""
    cfg, model, stops, prompts, refs = smollm2
    if bf16:
        from lilicorr.kernels.packed_linear import bf16_supported

        if not bf16_supported():
            pytest.skip("no native bf16 in oneDNN on this CPU")
    cfg = copy.deepcopy(cfg)
    cfg.engine.cpu_drafter_bf16 = bf16
    folder = shipped_checkpoint("smollm2-135m", system)
    assert folder is not None, f"no shipped export for {system}"
    meta = json.loads(open(f"{folder}/metrics.json").read())
    assert meta["data_fingerprint"] and meta["steps"] > 0  # the run that made it is on record
    dec = build_decoder(cfg, model, system, checkpoint=folder, stop_ids=stops, max_batch=2)
    results = dec.generate([Request(i, p, max_new_tokens=32) for i, p in enumerate(prompts)])
    assert [r.output_ids for r in results] == refs
    assert all(r.error is None for r in results)
    assert dec.stats.accepted_draft > 0  # a trained drafter gets some drafts accepted (random ones: ~never)


@pytest.mark.parametrize("system", ["dflash", "lilicorr"])
def test_engine_acceptance_equals_teacher_forced_proposals_at_its_anchors(smollm2, system):
    """Train/inference consistency: the drafts the engine verifies are the ones the trained model proposes
    teacher-forced (the training forward: cached-style target states, anchors, mask, feature scaling,
    draft vocabulary) at the anchors the engine visits. A mismatch anywhere makes the engine's acceptance
    differ from what validation measures. The engine's target states come from our forward, training's from
    transformers' (fp32, another summation order), so a near-tie may flip a draft now and then: the counts must
    agree within 2 tokens per prompt, while a real mismatch loses most of the ~15 accepted per 64 tokens."""
    from lilicorr.models.joint import JointModel

    cfg, model, stops, prompts, refs = smollm2
    cfg = copy.deepcopy(cfg)
    cfg.engine.draft_vocab = 0  # the model as trained (a run-time draft vocabulary changes its proposals)
    folder = shipped_checkpoint("smollm2-135m", system)
    dec = build_decoder(cfg, model, system, checkpoint=folder, stop_ids=stops, max_batch=1)
    joint = JointModel.load_exported(folder, model).eval()
    S = joint.block_size - 1
    total = 0
    for p in prompts:
        r = dec.generate([Request(0, p, max_new_tokens=64)])[0]
        ref = list(r.output_ids)  # the target's greedy continuation (the engine is lossless: test above)
        n = len(ref)
        ids = torch.tensor([p + ref])
        anchors = torch.arange(len(p), len(p) + n - 1)[None]  # every output position that starts a block
        mask = torch.zeros_like(ids, dtype=torch.bool)
        mask[0, len(p):] = True
        with torch.no_grad():
            b = joint.build_batch(ids, mask, anchors=anchors)
            compact = {} if b.vocab_ids is None else {"vocab_ids": b.vocab_ids}  # draft-vocabulary logits
            tokens = joint.head.propose(b.slot_logits, b.slot_hidden, b.target_state, b.anchor_ids, **compact).tokens
        accepted = []  # per anchor: drafted slots that equal the target's continuation, in a row
        for j, a in enumerate(anchors[0].tolist()):
            k = 0
            while k < S and a + 1 + k < len(p) + n and tokens[j, k] == ids[0, a + 1 + k]:
                k += 1
            accepted.append(k)
        walk, a = [], 0  # the engine's walk: the first output token anchors, then accepted + bonus onwards
        while a < n - 1:
            walk.append(accepted[a])
            a += accepted[a] + 1
        assert abs(r.blocks - len(walk)) <= 2 and abs(r.accepted_tokens - sum(walk)) <= 2, (
            (r.blocks, r.accepted_tokens), (len(walk), sum(walk)))
        total += sum(walk)
    assert total >= 8  # enough accepted drafts for the comparison to mean something


def test_shipped_lilicorr_goes_to_vllms_layout_as_trained_and_proposes_the_same(smollm2, tmp_path):
    """Issue 39 item 4: `jobs/export.py --layout zlab` writes the shipped LiLiCorr as vLLM's LiLiCorrDraftModel with
    no refusal and no conversion, and our engine decoding from that folder proposes, block by block, what it
    proposes from the shipped folder (the same tensors: the shipped export is bf16 already)."""
    import jobs.export as job

    cfg, model, stops, prompts, refs = smollm2
    folder = shipped_checkpoint("smollm2-135m", "lilicorr")
    z = tmp_path / "zlab"
    assert job.main(["--layout", "zlab", folder, str(z)]) == 0
    written = json.loads((z / "config.json").read_text())
    assert written["architectures"] == ["LiLiCorrDraftModel"] and "converted" not in written["lilicorr"]
    assert written["dflash_config"]["lilicorr_enabled"] and "draft_vocab_size" not in written
    cfg = copy.deepcopy(cfg)
    cfg.engine.draft_vocab = 0  # the model as vLLM runs it: the full vocabulary
    proposals, outputs = [], []
    for where in (folder, str(z)):
        dec = build_decoder(cfg, model, "lilicorr", checkpoint=where, stop_ids=stops, max_batch=1)
        seen = []
        dec.runner.drafting.observers.append(lambda o, seen=seen: seen.append(o.proposal.tokens.clone()))
        outputs.append([dec.generate([Request(0, p, max_new_tokens=32)])[0].output_ids for p in prompts])
        proposals.append(seen)
    assert outputs[0] == outputs[1] == refs
    assert len(proposals[0]) == len(proposals[1]) > 10
    assert all(torch.equal(a, b) for a, b in zip(*proposals))
