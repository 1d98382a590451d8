"""The scripted LiLiCorr inference pass (heads/lilicorr_fast.py) against the head's modules, bit for bit."""

import pytest
import torch

from lilicorr.config import load_config
from lilicorr.models.heads import lilicorr_fast
from lilicorr.models.joint import JointModel
from lilicorr.models.target import build_random_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CHOICES = [(), ("head.lilicorr_embed=rms", "head.lilicorr_feature_norm=none", "head.lilicorr_target=mean"),
           ("head.decode_rule=viterbi",)]


def _inputs(m, C, seed):
    g = torch.Generator().manual_seed(seed)
    S, V = m.block_size - 1, m.cfg.target.vocab_size
    logits = torch.randn(C, S, V, generator=g) * 3
    logits[0, :, :6] = 9.0  # tied tops
    hidden = torch.randn(C, S, m.drafter.hidden_size, generator=g)
    state = torch.randn(C, len(m.target.capture_ids) * m.cfg.target.hidden_size, generator=g)
    return logits, hidden, state, torch.zeros(C, dtype=torch.long)


def _reference(head, *args, **kw):
    lilicorr_fast.SCRIPTED = False
    try:
        return head.propose(*args, **kw)
    finally:
        lilicorr_fast.SCRIPTED = True


@pytest.mark.parametrize("extra", CHOICES)
def test_scripted_pass_equals_the_modules(extra):
    cfg = load_config("tiny-random", ["head.kind=lilicorr", *extra])
    torch.manual_seed(0)
    m = JointModel(cfg, build_random_target(cfg.target)).eval()
    assert lilicorr_fast.available()
    for C, seed in [(1, 0), (3, 1), (5, 2)]:
        args = _inputs(m, C, seed)
        with torch.no_grad():
            assert m.head._scripted_ok(args[0])
            fast, ref = m.head.propose(*args), _reference(m.head, *args)
            assert torch.equal(fast.tokens, ref.tokens)
            # the vectors themselves, bit for bit (the walk's inputs)
            cand = ref.extra["cand_ids"]
            S, K = cand.shape[1], cand.shape[2]
            from lilicorr.kernels.topk_logsoftmax import topk_logsoftmax
            feats = topk_logsoftmax(args[0].reshape(C * S, -1), K).features.view(C, S, K, 5)
            o, i, a = m.head.vectors(cand, feats, args[1], args[2])
            o2, i2, a2, _ = lilicorr_fast.infer(m.head, m.head.embed(cand), feats, args[1],
                                                m.head.target_projection(args[2]), True)
            assert torch.equal(o, o2) and torch.equal(i, i2) and torch.equal(a, a2)


def test_training_keeps_the_modules():
    cfg = load_config("tiny-random", ["head.kind=lilicorr"])
    m = JointModel(cfg, build_random_target(cfg.target))
    logits = _inputs(m, 1, 0)[0]
    assert not m.head._scripted_ok(logits)  # grad enabled: the modules (autograd) run


@pytest.mark.parametrize("extra", CHOICES[:2])
def test_compiled_one_row_proposal_equals_the_modules(extra):
    """The batch-1 compiled proposal (top-K, features, vectors, walk in one Inductor call) commits the modules'
    tokens from the same candidates, tied top logits included (exact integer keys for the top-K)."""
    cfg = load_config("tiny-random", ["head.kind=lilicorr", *extra])
    torch.manual_seed(0)
    m = JointModel(cfg, build_random_target(cfg.target)).eval()
    for seed in range(4):
        logits, hidden, state, anchor = _inputs(m, 1, seed)
        with torch.no_grad():
            tokens, cand = lilicorr_fast.propose_one_row(m.head, logits, None, hidden, state, None, strict=True)
            ref = _reference(m.head, logits, hidden, state, anchor)
            assert torch.equal(cand, ref.extra["cand_ids"])
            assert torch.equal(tokens, ref.tokens)
            # over a draft vocabulary: columns -> token ids through vocab_ids, as the engine's compact logits; and
            # with the drafter's fused context (the engine's), which the graph itself projects for a "fused" head
            vocab_ids = torch.randperm(cfg.target.vocab_size, generator=torch.Generator().manual_seed(seed))[:48]
            ctx = m.drafter.fuse_context(state) if m.head.reads_context_state else None
            tokens, cand = lilicorr_fast.propose_one_row(m.head, logits[..., :48], vocab_ids, hidden, state, ctx,
                                                         strict=True)
            ref = _reference(m.head, logits[..., :48], hidden, state, anchor, vocab_ids=vocab_ids, context_state=ctx)
            assert torch.equal(cand, ref.extra["cand_ids"]) and torch.equal(tokens, ref.tokens)


def test_compiled_one_row_proposal_sees_in_place_updates():
    """Its precomputed tables (embed_proj of every column's embedding, out/in heads stacked, attention biases)
    are remade when a parameter they derive from changes in place, as an optimizer step or load_state_dict does."""
    cfg = load_config("tiny-random", ["head.kind=lilicorr"])
    torch.manual_seed(0)
    m = JointModel(cfg, build_random_target(cfg.target)).eval()
    logits, hidden, state, anchor = _inputs(m, 1, 1)
    with torch.no_grad():
        before, _ = lilicorr_fast.propose_one_row(m.head, logits, None, hidden, state, None, strict=True)
        g = torch.Generator().manual_seed(3)
        for p in (m.head.embed_proj.weight, m.head.out_head.weight, m.head.in_head.bias,
                  m.head.lattice.layer_biases()[0].slot_distance):
            p.add_(torch.randn(p.shape, generator=g) * p.std().clamp_min(1.0))
        after, _ = lilicorr_fast.propose_one_row(m.head, logits, None, hidden, state, None, strict=True)
        ref = _reference(m.head, logits, hidden, state, anchor)
    assert torch.equal(after, ref.tokens)
    assert not torch.equal(after, before)  # the update did change the walk (else the check above proves nothing)


def test_propose_takes_the_compiled_path_only_for_one_greedy_row(monkeypatch):
    cfg = load_config("tiny-random", ["head.kind=lilicorr"])
    torch.manual_seed(0)
    m = JointModel(cfg, build_random_target(cfg.target)).eval()
    calls = []
    real = lilicorr_fast.propose_one_row
    monkeypatch.setattr(lilicorr_fast, "propose_one_row", lambda *a, **k: calls.append(a[1].shape) or real(*a, **k))
    with torch.no_grad():
        m.head.propose(*_inputs(m, 1, 0))
        assert calls == []  # off unless the engine turns it on (engine.cpu_compile_head)
        m.head.compile_one_row = True
        one = m.head.propose(*_inputs(m, 1, 0))
        m.head.propose(*_inputs(m, 3, 1))  # rows > 1: the scripted pass
        assert len(calls) == 1 and calls[0][0] == 1
        assert torch.equal(one.tokens, _reference(m.head, *_inputs(m, 1, 0)).tokens)
