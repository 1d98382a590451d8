"""The scripted LiLiCorr inference pass (heads/lilicorr_fast.py) against the head's modules, bit for bit, and the
HeadInference that asks for it: the engine's, passed to every propose, none of it kept on the head."""

import pytest
import torch

from lilicorr.config import load_config
from lilicorr.models.heads import lilicorr_fast
from lilicorr.models.heads.lilicorr_fast import HeadInference
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
    return head.propose(*args, **kw)  # no HeadInference: the modules


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
            fast, ref = m.head.propose(*args, fast=HeadInference()), _reference(m.head, *args)
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


def test_the_scripted_pass_sees_in_place_updates():
    """The attention biases a HeadInference keeps are remade when a parameter they derive from changes in place,
    as an optimizer step or load_state_dict does."""
    cfg = load_config("tiny-random", ["head.kind=lilicorr"])
    torch.manual_seed(0)
    m = JointModel(cfg, build_random_target(cfg.target)).eval()
    fast = HeadInference()
    args = _inputs(m, 1, 1)
    with torch.no_grad():
        before = m.head.propose(*args, fast=fast).tokens
        g = torch.Generator().manual_seed(3)
        for b in m.head.lattice.layer_biases():
            for p in (b.slot_distance, b.same_slot):
                p.add_(torch.randn(p.shape, generator=g) * 10)
        after = m.head.propose(*args, fast=fast).tokens
        ref = _reference(m.head, *args)
    assert torch.equal(after, ref.tokens)
    assert not torch.equal(after, before)  # the update did change the walk (else the check above proves nothing)


def test_the_head_keeps_no_inference_state():
    """Two HeadInferences over one head (two decoders) each keep their own tables; the head's attributes are the
    same before and after proposals through both, and a call without one runs the modules."""
    cfg = load_config("tiny-random", ["head.kind=lilicorr"])
    torch.manual_seed(0)
    m = JointModel(cfg, build_random_target(cfg.target)).eval()
    keys = set(m.head.__dict__)
    a, b = HeadInference(), HeadInference(scripted=False)
    args = _inputs(m, 3, 2)
    with torch.no_grad():
        ta, tb, ref = m.head.propose(*args, fast=a), m.head.propose(*args, fast=b), _reference(m.head, *args)
    assert set(m.head.__dict__) == keys
    assert a._tables and not b._tables  # b ran the modules: nothing derived
    assert torch.equal(ta.tokens, ref.tokens) and torch.equal(tb.tokens, ref.tokens)
