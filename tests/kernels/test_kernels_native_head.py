"""The native batch-1 LiLiCorr head (kernels/native/lilicorr_head.c via heads/lilicorr_native.py) against the head's
modules: the same candidates and committed tokens, and the walk's scores within fp32 reordering of the sums."""

import warnings

import pytest
import torch

from lilicorr.config import load_config
from lilicorr.kernels.lattice import lattice_scores_reference
from lilicorr.kernels.native import NativeLibrary
from lilicorr.kernels.topk_logsoftmax import topk_logsoftmax
from lilicorr.models.heads import lilicorr_native
from lilicorr.models.heads.lilicorr_fast import HeadInference
from lilicorr.models.joint import JointModel
from lilicorr.models.target import build_random_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CHOICES = [
    (),  # Model-Optimizer's choices: raw embedding, LayerNorm'd features, the fused target state
    ("head.lilicorr_embed=rms", "head.lilicorr_feature_norm=none", "head.lilicorr_target=mean"),
    # widths that are not multiples of 16 (padded panels, partial stores) and more candidates
    ("head.width=40", "head.embed_dim=24", "head.ffn_width=56", "head.num_heads=4", "head.top_k=5"),
]


def _model(extra=(), seed=0):
    cfg = load_config("tiny-random", ["head.kind=lilicorr", *extra])
    torch.manual_seed(seed)
    return JointModel(cfg, build_random_target(cfg.target)).eval()


def _inputs(m, seed, columns=None):
    g = torch.Generator().manual_seed(seed)
    S, V = m.block_size - 1, columns or m.cfg.target.vocab_size
    logits = torch.randn(1, S, V, generator=g) * 3
    logits[0, :, :6] = 9.0  # tied tops: the lowest ids first
    hidden = torch.randn(1, S, m.drafter.hidden_size, generator=g)
    state = torch.randn(1, len(m.target.capture_ids) * m.cfg.target.hidden_size, generator=g)
    return logits, hidden, state


def _modules(head, logits, hidden, state, vocab_ids=None, ctx=None):
    """The modules' proposal and the scores its walk chose from at each slot (the anchor's, then the pick's)."""
    ref = head.propose(logits, hidden, state, torch.zeros(1, dtype=torch.long), vocab_ids=vocab_ids,
                       context_state=ctx)  # no HeadInference: the modules
    S, K = logits.shape[1], head.K
    cand = ref.extra["cand_ids"]
    feats = topk_logsoftmax(logits.reshape(S, -1), K).features.view(1, S, K, 5)
    o, i, a = head.vectors(cand, feats, hidden, state, ctx)
    anchor, pair = lattice_scores_reference(o, i, a, head.cfg.sigma)
    path = (cand == ref.tokens[..., None]).int().argmax(-1)[0]  # each slot's picked candidate
    walk = torch.stack([anchor[0]] + [pair[0, s - 1, path[s - 1]] for s in range(1, S)])
    return ref, walk


@pytest.mark.parametrize("extra", CHOICES)
def test_native_proposal_equals_the_modules(extra):
    m = _model(extra)
    assert lilicorr_native.available(), lilicorr_native._LIB.failed
    V = m.cfg.target.vocab_size
    tables = HeadInference(native=True)
    for seed in range(3):
        logits, hidden, state = _inputs(m, seed)
        # over the whole vocabulary (columns are ids), then over a draft vocabulary with the engine's fused context
        vocab_ids = torch.randperm(V, generator=torch.Generator().manual_seed(seed))[:48]
        ctx = m.drafter.fuse_context(state) if m.head.reads_context_state else None
        for lg, ids, c in [(logits, None, None), (logits[..., :48].contiguous(), vocab_ids, ctx)]:
            with torch.no_grad():
                walk = torch.full((1, lg.shape[1], m.head.K), float("nan"))
                tokens, cand = lilicorr_native.propose_one_row(m.head, tables, lg, ids, hidden, state, c, walk)
                ref, ref_walk = _modules(m.head, lg, hidden, state, ids, c)
            assert torch.equal(cand, ref.extra["cand_ids"])
            assert torch.equal(tokens, ref.tokens)
            torch.testing.assert_close(walk[0], ref_walk, atol=2e-5, rtol=1e-5)
            assert ref_walk.std() > 0.05  # scores that differ: a walk that could have picked otherwise


def test_native_reads_bf16_panels_only_where_every_weight_is_bf16():
    """A head loaded from a bf16 export packs its weights in bf16 (exact: half the bytes, the same products);
    one trained in fp32 keeps fp32 panels. Both commit the modules' tokens."""
    for rounded in (False, True):
        m = _model(seed=1)
        if rounded:
            with torch.no_grad():
                for p in m.head.parameters():
                    p.copy_(p.to(torch.bfloat16).float())
        logits, hidden, state = _inputs(m, 5)
        tables = HeadInference(native=True)
        with torch.no_grad():
            tokens, _ = lilicorr_native.propose_one_row(m.head, tables, logits, None, hidden, state, None)
            ref, _ = _modules(m.head, logits, hidden, state)
        plan = tables.native_plan
        assert bool(plan.arrays[1][12]) is rounded  # dims[D_BF16]
        assert torch.equal(tokens, ref.tokens)


def test_native_plan_follows_in_place_updates_within_its_recheck():
    """An optimizer step or a load reaches the kernel within RECHECK proposals (the plan's stamp is compared every
    RECHECK-th call, not every call: see heads/lilicorr_native.py)."""
    m = _model()
    logits, hidden, state = _inputs(m, 1)
    tables = HeadInference(native=True)
    with torch.no_grad():
        before, _ = lilicorr_native.propose_one_row(m.head, tables, logits, None, hidden, state, None)
        g = torch.Generator().manual_seed(3)
        for p in (m.head.embed_proj.weight, m.head.out_head.weight, m.head.in_head.bias,
                  m.head.lattice.layer_biases()[0].slot_distance):
            p.add_(torch.randn(p.shape, generator=g) * p.std().clamp_min(1.0))
        ref, _ = _modules(m.head, logits, hidden, state)
        assert not torch.equal(ref.tokens, before)  # the update changes the walk (else the check proves nothing)
        seen = [torch.equal(lilicorr_native.propose_one_row(m.head, tables, logits, None, hidden, state, None)[0],
                            ref.tokens) for _ in range(lilicorr_native.RECHECK)]
    assert seen[-1]
    assert all(seen[seen.index(True):])  # once remade, it stays


def test_propose_takes_the_native_call_only_when_asked():
    """Only a HeadInference with native=True sends one greedy row to the C call, and its plan lives there, never on
    the head; two rows take the scripted pass."""
    m = _model()
    logits, hidden, state = _inputs(m, 2)
    keys = set(m.head.__dict__)
    with torch.no_grad():
        scripted = HeadInference()
        m.head.propose(logits, hidden, state, torch.zeros(1, dtype=torch.long), fast=scripted)
        assert scripted.native_plan is None
        native = HeadInference(native=True)
        got = m.head.propose(logits, hidden, state, torch.zeros(1, dtype=torch.long), fast=native)
        assert native.native_plan is not None and set(m.head.__dict__) == keys
        ref, _ = _modules(m.head, logits, hidden, state)
        assert torch.equal(got.tokens, ref.tokens)
        two = m.head.propose(logits.expand(2, -1, -1), hidden.expand(2, -1, -1), state.expand(2, -1),
                             torch.zeros(2, dtype=torch.long), fast=native)  # two rows: the scripted pass
        assert torch.equal(two.tokens[1:], ref.tokens)


def test_a_missing_compiler_is_one_warning_and_no_library(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "no-such-compiler-lilicorr")
    monkeypatch.setenv("LILICORR_NATIVE_CACHE", str(tmp_path))
    lib = NativeLibrary("lilicorr_head.c", "test kernel", "its reference", lambda lib: None)
    with pytest.warns(RuntimeWarning, match="no C compiler"):
        assert lib.get() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: a second get() is silent
        assert lib.get() is None
    assert "no-such-compiler-lilicorr" in lib.failed


def test_the_build_is_cached_per_source_and_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("LILICORR_NATIVE_CACHE", str(tmp_path))
    first = NativeLibrary("lilicorr_head.c", "test kernel", "its reference", lambda lib: None)
    path = first.build()
    assert path.parent == tmp_path and path.suffix == ".so"
    stamp = path.stat().st_mtime_ns
    assert NativeLibrary("lilicorr_head.c", "t", "r", lambda lib: None).build() == path  # reused, not rebuilt
    assert path.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no half-written temporaries left behind
