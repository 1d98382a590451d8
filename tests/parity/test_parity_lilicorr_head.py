"""Parity of the LiLiCorr head's proposal (models/heads/lilicorr.py `propose`): the top-K candidates of each slot, the
lattice pass, the unit-norm vectors, the walk and the committed tokens.

Reference: the head's modules, `LiLiCorrHead.propose` without a HeadInference (`vectors`, LatticeTransformer,
lattice_scores_reference, the greedy / Viterbi walk of kernels/lattice.py); `_modules` below also returns the scores
its greedy walk chose from.
The fast path (engine/backend.py: `head`), asked for through the HeadInference a decoder passes to `propose`:
  native-c   heads/lilicorr_native.py + kernels/native/lilicorr_head.c: the whole greedy proposal of one fp32 row in
             one C call (engine.cpu_native_head; HeadInference(native=True)), its Linear weights in fp32 panels, or bf16
             ones where every weight is a bf16 value (a shipped export)
Shapes: the tiny head under its open choices (Model-Optimizer's defaults, ours, widths that are not multiples of 16
with K 5, Viterbi), and SmolLM2-135M's shipped head (vocabulary 49,152, hidden 576, width 128, K 4, 7 slots); over
the whole vocabulary and over a draft vocabulary with the engine's fused context.
"""

import copy
import functools
import os
import shutil

import pytest
import torch

from lilicorr.config import load_config
from lilicorr.kernels.lattice import lattice_scores_reference
from lilicorr.kernels.topk_logsoftmax import topk_logsoftmax
from lilicorr.models.heads import lilicorr_native
from lilicorr.models.heads.lilicorr_inference import HeadInference
from lilicorr.models.joint import JointModel
from lilicorr.models.target import build_random_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")
# Only a missing compiler skips: with one, a failed build fails the test (lilicorr_native._LIB.failed says why)
NO_CC = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None,
                           reason="no C compiler (CC, else cc, not on PATH): the native head is not built here")

SHAPES = {
    "modelopt": (),  # Model-Optimizer's choices: raw embedding, LayerNorm'd features, the fused target state
    "ours": ("head.lilicorr_embed=rms", "head.lilicorr_feature_norm=none", "head.lilicorr_target=mean"),
    # widths that are not multiples of 16 (padded panels, partial stores) and more candidates
    "odd-widths": ("head.width=40", "head.embed_dim=24", "head.ffn_width=56", "head.num_heads=4", "head.top_k=5"),
    "viterbi": ("head.decode_rule=viterbi",),
    "smollm2": ("target.vocab_size=49152", "target.hidden_size=576", "target.num_heads=9", "target.num_kv_heads=3",
                "target.head_dim=64", "target.intermediate_size=1536", "drafter.block_size=8",
                "drafter.num_captured=4", "head.top_k=4", "head.embed_dim=128", "head.width=128", "head.ffn_width=256"),
}
DRAFT_VOCAB = {"smollm2": 8192}  # columns of the draft-vocabulary case (the shipped drafters'); 48 elsewhere
# Tolerance: tokens and candidates exact. The C kernel's walk scores: within fp32 reordering of its sums (blocked dot
# products over W and d).
NATIVE_WALK_TOL = dict(atol=2e-5, rtol=1e-5)
BACKENDS = [pytest.param("native-c", name, marks=NO_CC) for name in SHAPES if name != "viterbi"]  # greedy only
BACKENDS += [pytest.param("native-c-bf16-panels", name, marks=NO_CC) for name in ("modelopt", "ours", "smollm2")]


def _build(extra=(), seed=0):
    cfg = load_config("tiny-random", ["head.kind=lilicorr", *extra])
    torch.manual_seed(seed)
    return JointModel(cfg, build_random_target(cfg.target)).eval()


@functools.lru_cache(maxsize=None)
def _model(shape: str, bf16_values: bool = False):
    """The shape's joint model, made once (tests that change weights build their own); bf16_values: the head's
    weights rounded to bf16 values, as a head loaded from a bf16 export holds them."""
    m = _build(SHAPES[shape]) if not bf16_values else copy.deepcopy(_model(shape))
    if bf16_values:
        with torch.no_grad():
            for p in m.head.parameters():
                p.copy_(p.to(torch.bfloat16).float())
    return m


def _inputs(m, C, seed, columns=None):
    g = torch.Generator().manual_seed(seed)
    S, V = m.block_size - 1, columns or m.cfg.target.vocab_size
    logits = torch.randn(C, S, V, generator=g) * 3
    logits[0, :, :6] = 9.0  # tied tops: the lowest ids first
    hidden = torch.randn(C, S, m.drafter.hidden_size, generator=g)
    state = torch.randn(C, len(m.target.capture_ids) * m.cfg.target.hidden_size, generator=g)
    return logits, hidden, state


def _cases(m, C, seed, shape):
    """(logits, vocab_ids, hidden, state, context) over the whole vocabulary (columns are ids), then over a draft
    vocabulary with the engine's fused context."""
    logits, hidden, state = _inputs(m, C, seed)
    V, n = logits.shape[-1], DRAFT_VOCAB.get(shape, 48)
    vocab_ids = torch.randperm(V, generator=torch.Generator().manual_seed(seed))[:n]
    ctx = m.drafter.fuse_context(state) if m.head.reads_context_state else None
    return [(logits, None, hidden, state, None), (logits[..., :n].contiguous(), vocab_ids, hidden, state, ctx)]


def _modules(head, logits, hidden, state, vocab_ids=None, ctx=None):
    """The reference: the modules' proposal, and the scores its greedy walk chose from at each slot (the anchor's,
    then each pick's successors)."""
    C, S, K = logits.shape[0], logits.shape[1], head.K
    ref = head.propose(logits, hidden, state, torch.zeros(C, dtype=torch.long), vocab_ids=vocab_ids,
                       context_state=ctx)  # no HeadInference: the modules
    cand = ref.extra["cand_ids"]
    feats = topk_logsoftmax(logits.reshape(C * S, -1), K).features.view(C, S, K, 5)
    o, i, a = head.vectors(cand, feats, hidden, state, ctx)
    anchor, pair = lattice_scores_reference(o, i, a, head.cfg.sigma)
    path = (cand == ref.tokens[..., None]).int().argmax(-1)[0]  # row 0's picked candidate per slot
    walk = torch.stack([anchor[0]] + [pair[0, s - 1, path[s - 1]] for s in range(1, S)])
    return ref, walk, (cand, feats, (o, i, a))


@pytest.mark.parametrize("backend,shape", BACKENDS)
def test_backend_proposes_what_the_modules_propose(backend, shape):
    m = _model(shape, bf16_values=backend.endswith("bf16-panels"))
    head = m.head
    scale = shape == "smollm2"  # one case of each kind at the scale shape
    assert lilicorr_native.available(), lilicorr_native._LIB.failed
    tables = HeadInference(native=True)
    for seed in [0] if scale else [0, 1, 2]:
        for logits, ids, hidden, state, ctx in _cases(m, 1, seed, shape):
            with torch.no_grad():
                walk = torch.full((1, logits.shape[1], head.K), float("nan"))
                tokens, cand = lilicorr_native.propose_one_row(head, tables, logits, ids, hidden, state, ctx, walk)
                ref, ref_walk, _ = _modules(head, logits, hidden, state, ids, ctx)
                public = head.propose(logits, hidden, state, torch.zeros(1, dtype=torch.long), vocab_ids=ids,
                                      context_state=ctx, fast=tables)  # the same call through propose
            assert torch.equal(cand, ref.extra["cand_ids"])
            assert torch.equal(tokens, ref.tokens) and torch.equal(public.tokens, ref.tokens)
            torch.testing.assert_close(walk[0], ref_walk, **NATIVE_WALK_TOL)
            assert ref_walk.std() > 0.05  # scores that differ: a walk that could have picked otherwise
            # the panels: bf16 exactly where every weight is a bf16 value (half the bytes, the same products)
            assert bool(tables.native_plan.arrays[1][12]) is backend.endswith("bf16-panels")  # dims[D_BF16]


# ---------------------------------------------------------------- where each path runs
@NO_CC
def test_propose_takes_the_native_call_only_when_asked():
    """Only a HeadInference with native=True sends one greedy row to the C call, and its plan lives there, never on
    the head; two rows, or a HeadInference without it, take the modules."""
    m = _model("modelopt")
    logits, hidden, state = _inputs(m, 1, 2)
    keys = set(m.head.__dict__)
    with torch.no_grad():
        modules = HeadInference()
        m.head.propose(logits, hidden, state, torch.zeros(1, dtype=torch.long), fast=modules)
        assert modules.native_plan is None
        native = HeadInference(native=True)
        got = m.head.propose(logits, hidden, state, torch.zeros(1, dtype=torch.long), fast=native)
        assert native.native_plan is not None and set(m.head.__dict__) == keys
        ref, _, _ = _modules(m.head, logits, hidden, state)
        assert torch.equal(got.tokens, ref.tokens)
        two = m.head.propose(logits.expand(2, -1, -1), hidden.expand(2, -1, -1), state.expand(2, -1),
                             torch.zeros(2, dtype=torch.long), fast=native)  # two rows: the modules
        assert torch.equal(two.tokens[1:], ref.tokens)


# ---------------------------------------------------------------- after an in-place update of the weights
@NO_CC
def test_native_plan_follows_in_place_updates_within_its_recheck():
    """An optimizer step or a load reaches the kernel within RECHECK proposals (the plan's stamp is compared every
    RECHECK-th call, not every call: see heads/lilicorr_native.py)."""
    m = _build()
    logits, hidden, state = _inputs(m, 1, 1)
    tables = HeadInference(native=True)
    with torch.no_grad():
        before, _ = lilicorr_native.propose_one_row(m.head, tables, logits, None, hidden, state, None)
        g = torch.Generator().manual_seed(3)
        for p in (m.head.embed_proj.weight, m.head.out_head.weight, m.head.in_head.bias,
                  m.head.lattice.layer_biases()[0].slot_distance):
            p.add_(torch.randn(p.shape, generator=g) * p.std().clamp_min(1.0))
        ref, _, _ = _modules(m.head, logits, hidden, state)
        assert not torch.equal(ref.tokens, before)  # the update changes the walk (else the check proves nothing)
        seen = [torch.equal(lilicorr_native.propose_one_row(m.head, tables, logits, None, hidden, state, None)[0],
                            ref.tokens) for _ in range(lilicorr_native.RECHECK)]
    assert seen[-1]
    assert all(seen[seen.index(True):])  # once remade, it stays
