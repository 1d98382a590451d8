"""Greedy output of every system equals transformers' greedy `generate`, token for token.

Tiny random Llama and Qwen3 targets, 8 prompts of mixed lengths, stop tokens that end some requests
mid-block, and fewer slots than requests so sequences join and leave the running batch. Random
drafters are accepted rarely, so a second test forces long accepted prefixes with drafts that copy the
target's continuation up to a random slot and then go wrong.
"""

import copy

import pytest
import torch

from lilicorr.engine.requests import Request
from lilicorr.engine.systems import SYSTEMS, build_decoder
from engine_helpers import tiny_config, varied_random_target
from lilicorr.models.heads.base import Proposal

pytestmark = pytest.mark.usefixtures("one_torch_thread", "pack_small_weights")


@pytest.fixture(scope="module", autouse=True)
def pack_small_weights():
    """The tiny targets' weights are below packed_linear.MIN_ELEMENTS (real ones pack, these would take MKL): lower
    it, so every system's multi-row passes here run on the oneDNN-packed path."""
    from lilicorr.kernels import packed_linear

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(packed_linear, "MIN_ELEMENTS", 0)
        yield

MAX_NEW = 14


LENGTHS = [1, 7, 3, 12, 5, 2, 9, 4]


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def setup(request):
    cfg = tiny_config(request.param)
    model = varied_random_target(cfg, seed=11)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, cfg.target.vocab_size, (n,), generator=g).tolist() for n in LENGTHS]
    free = []
    for p in prompts:  # greedy continuations without stops, to pick stop ids that do occur
        out = model.generate(torch.tensor([p]), max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
        free.append(out[0, len(p):].tolist())
    stops = [free[1][4], free[3][9]]  # end request 1 at its 5th token, request 3 by its 10th
    refs = []
    for p in prompts:
        out = model.generate(torch.tensor([p]), max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=stops,
                             pad_token_id=0)
        new = out[0, len(p):].tolist()
        cut = next((i + 1 for i, t in enumerate(new) if t in stops), len(new))
        refs.append(new[:cut])
    assert any(len(r) < MAX_NEW for r in refs)
    return cfg, model, prompts, stops, refs


def run(dec, prompts):
    return dec.generate([Request(i, p, max_new_tokens=MAX_NEW) for i, p in enumerate(prompts)])


@pytest.mark.parametrize("system", list(SYSTEMS))
def test_every_system_random_drafter_is_lossless(setup, system):
    cfg, model, prompts, stops, refs = setup
    dec = build_decoder(cfg, model, system, stop_ids=stops, max_batch=3)
    assert dec.runner.target.layers[0].qkv.packed is not None
    results = run(dec, prompts)
    assert [r.output_ids for r in results] == refs
    assert all(r.error is None for r in results)
    assert dec.stats.blocks == sum(r.blocks for r in results)


def _oracle(dec, refs, seed):
    """Wrap the decoder's proposer: drafts copy the reference for k ~ U{0..S} slots, then go wrong;
    each row offers a random number of slots (as DSpark's confidence cut does)."""
    inner = dec.runner.draft
    g = torch.Generator().manual_seed(seed)
    V = dec.target.vocab_size

    def propose(rows, anchor, lens, ctx_len, graphs=None):
        prop = inner(rows, anchor, lens, ctx_len, graphs)
        tokens = prop.tokens.clone()
        S = tokens.shape[1]
        for s in range(tokens.shape[0]):
            live = dec.slots[rows.start + s]
            if live is None or not live.running:
                continue
            ref = refs[live.request.id]
            done = len(live.result.output_ids)
            k = int(torch.randint(0, S + 1, (1,), generator=g))
            for j in range(S):
                want = ref[done + j] if done + j < len(ref) else 0
                tokens[s, j] = want if j < k else (want + 1 + j) % V
        num = torch.randint(0, S + 1, (tokens.shape[0],), generator=g)
        num = torch.where(torch.rand(tokens.shape[0], generator=g) < 0.7, torch.full_like(num, S), num)
        return Proposal(tokens=tokens, num_proposed=num, q_probs=prop.q_probs)

    dec.runner.draft = propose


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_long_accepted_prefixes_are_lossless(setup, batch):
    cfg, model, prompts, stops, refs = setup
    dec = build_decoder(cfg, model, "dflash", stop_ids=stops, max_batch=batch)
    _oracle(dec, refs, seed=batch)
    results = run(dec, prompts)
    assert [r.output_ids for r in results] == refs
    s = dec.stats
    assert s.accepted_draft > 0 and s.tau > 1.4  # the walk really did accept multi-token prefixes
    assert s.tau == pytest.approx((s.accepted_draft + s.bonus) / s.blocks)
    assert sum(s.slot_accepted) == s.accepted_draft


def test_verifying_only_the_first_drafts_is_lossless(setup):
    """engine.draft_tokens=k: every target pass verifies the anchor + at most k drafts (a shorter, cheaper
    pass), the oracle's long correct prefixes are cut at k, and the output is still the target's own."""
    cfg, model, prompts, stops, refs = setup
    cfg = tiny_config(model.config.model_type, overrides=["drafter.block_size=6", "engine.draft_tokens=2"])
    dec = build_decoder(cfg, model, "dflash", stop_ids=stops, max_batch=3)
    assert dec.runner.block == 3  # of the drafter's 5 slots
    _oracle(dec, refs, seed=3)
    widths = []
    inner = dec.runner.target_pass
    dec.runner.target_pass = lambda tokens, *a, **k: widths.append(tokens.shape[1]) or inner(tokens, *a, **k)
    results = run(dec, prompts)
    assert [r.output_ids for r in results] == refs
    assert set(widths) == {3}
    assert 1.4 < dec.stats.tau <= 3 and len(dec.stats.slot_accepted) == 2


CHAIN_SYSTEMS = [s for s in SYSTEMS if s not in ("ar", "ddtree")]


@pytest.mark.parametrize("system", CHAIN_SYSTEMS)
def test_draft_tokens_heads_see_only_the_verified_slots(setup, system):
    """engine.draft_tokens=k: the drafter's block runs whole (its slots attend to each other), but the LM head and
    the spec head get only the first k slots, drafts past k being never verified; the output stays the target's."""
    cfg, model, prompts, stops, refs = setup
    cfg = tiny_config(model.config.model_type, overrides=["drafter.block_size=6", "engine.draft_tokens=2"])
    dec = build_decoder(cfg, model, system, stop_ids=stops, max_batch=3)
    seen = []  # slots reaching the spec head, after the LM head
    dec.runner.drafting.observers.append(
        lambda call: seen.append((call.slot_logits.shape[1], call.slot_hidden.shape[1])))
    assert [r.output_ids for r in run(dec, prompts)] == refs
    assert set(seen) == {(2, 2)}


def test_draft_tokens_cut_keeps_dflash_drafts(setup):
    """DFlash drafts each slot from its own logits: cut to k slots, every block proposes and accepts what the
    whole block's first k slots would."""
    cfg, model, prompts, stops, refs = setup
    cfg = tiny_config(model.config.model_type, overrides=["drafter.block_size=6", "engine.draft_tokens=2"])
    counts = []
    for cut in (True, False):
        dec = build_decoder(cfg, model, "dflash", stop_ids=stops, max_batch=3)
        tokens = []

        def draft(*a, inner=dec.runner.draft, **k):
            proposal = inner(*a, **k)
            tokens.append(proposal.tokens[:, :2].tolist())  # the drafts the verifier sees
            return proposal

        dec.runner.draft = draft
        if not cut:
            dec.runner.draft_slots = None  # the whole block through the LM head, as before the cut
        assert [r.output_ids for r in run(dec, prompts)] == refs
        counts.append((tokens, dec.stats.blocks, dec.stats.accepted_draft))
    assert counts[0] == counts[1]


@pytest.mark.parametrize("k,system,match", [(6, "dflash", "between 1 and"), (2, "ddtree", "tree head")])
def test_draft_tokens_out_of_range_is_refused(setup, k, system, match):
    cfg, model, _, stops, _ = setup
    cfg = tiny_config(model.config.model_type, overrides=["drafter.block_size=6", f"engine.draft_tokens={k}"])
    with pytest.raises(ValueError, match=match):
        build_decoder(cfg, model, system, stop_ids=stops, max_batch=1)


def test_trained_drafter_from_checkpoint_is_lossless(setup, tmp_path):
    """A JointModel trained for a few steps on the target's own greedy text, exported and reloaded."""
    from lilicorr.models.joint import JointModel

    cfg, model, prompts, stops, refs = setup
    cfg = tiny_config(model.config.model_type, overrides=["head.kind=lilicorr"])
    joint = JointModel(cfg, model)
    g = torch.Generator().manual_seed(0)
    seqs = torch.stack([torch.tensor(p[:1] + r + [0] * (MAX_NEW + 1 - len(r)))
                        for p, r in zip(prompts, refs)])  # (8, 16) prompt token + continuation
    mask = torch.ones_like(seqs, dtype=torch.bool)
    opt = torch.optim.AdamW(joint.param_groups(cfg.optim))
    for _ in range(3):
        out = joint(seqs, mask, generator=g)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    joint.export(tmp_path / "ck")
    for system in ["lilicorr", "lilicorr-viterbi"]:
        dec = build_decoder(cfg, model, system, checkpoint=str(tmp_path / "ck"), stop_ids=stops, max_batch=8)
        assert [r.output_ids for r in run(dec, prompts)] == refs


@pytest.mark.parametrize("system", ["ar", "lilicorr"])
def test_static_shape_path_of_cuda_graphs_is_lossless(setup, system):
    """The CUDA-graph step's static shapes (every slot, whole-capacity attention, static buffers), run
    eagerly on CPU: capture itself needs a GPU and is untested here."""
    from lilicorr.engine.cuda_graphs import GraphedSteps

    cfg, model, prompts, stops, refs = setup
    dec = build_decoder(cfg, model, system, stop_ids=stops, max_batch=3)
    dec.runner.graphs = GraphedSteps(dec.runner, capture=False)
    assert [r.output_ids for r in run(dec, prompts)] == refs


@pytest.mark.parametrize("budget", [3, 8])
def test_prefill_across_steps_is_lossless(setup, budget):
    """A prefill budget of a few tokens per step: prompts span several steps while other rows decode."""
    cfg, model, prompts, stops, refs = setup
    cfg = tiny_config(model.config.model_type, overrides=[f"engine.prefill_token_budget={budget}"])
    dec = build_decoder(cfg, model, "lilicorr", stop_ids=stops, max_batch=8)
    assert [r.output_ids for r in run(dec, prompts)] == refs


def test_prefill_pass_split_by_token_cap_is_lossless(setup, monkeypatch):
    """One step's prefill split into passes of at most PREFILL_TOKENS padded tokens (8 here)."""
    import lilicorr.engine.runner as runner_module

    monkeypatch.setattr(runner_module, "PREFILL_TOKENS", 8)
    cfg, model, prompts, stops, refs = setup
    dec = build_decoder(cfg, model, "lilicorr", stop_ids=stops, max_batch=8)
    assert [r.output_ids for r in run(dec, prompts)] == refs


def test_prefill_of_a_row_does_not_depend_on_its_batch_mates(setup):
    """Prefill writes each prompt straight into its own slot, in its own passes unless its batch mates have its
    shape (runner.prefill_groups): a prompt prefilled alone and beside two of other lengths leaves bitwise the
    same K/V, drafter context and first token."""
    from lilicorr.engine.runner import SlotSampling

    cfg, model, prompts, stops, refs = setup
    dec = build_decoder(cfg, model, "dflash", stop_ids=stops, max_batch=3)
    runner = dec.runner
    greedy = SlotSampling(temperature=0.0, top_k=0, top_p=1.0, generator=None)
    p = prompts[2]  # 3 tokens, beside prompts of 12 and 9
    snaps = []
    for batch in ([p], [prompts[3], p, prompts[6]]):
        for s in range(len(batch)):
            runner.open_slot(s, greedy, len(batch[s]), 4)
        firsts = runner.prefill(list(range(len(batch))), batch, [0] * len(batch), [True] * len(batch))
        s = batch.index(p)
        n = len(p)
        snaps.append((firsts[s], [buf[s, :, :n].clone() for buf in runner.cache.k + runner.cache.v],
                      [buf[s, :, :n].clone() for buf in runner.drafting.ctx_cache.k + runner.drafting.ctx_cache.v],
                      runner.drafting.target_state[s].clone()))
        for s in range(len(batch)):
            runner.close_slot(s)
    (f0, kv0, ctx0, st0), (f1, kv1, ctx1, st1) = snaps
    assert f0 == f1 == refs[2][0]
    assert all(torch.equal(a, b) for a, b in zip(kv0 + ctx0, kv1 + ctx1)) and torch.equal(st0, st1)


def test_equal_prompts_share_prefill_passes_and_stay_lossless(setup):
    """Equal-length prompts prefill together (runner.prefill_groups): the first step's in one slice of
    slots, later ones, admitted into the scattered slots that early finishers free (0, 2, 4), through a
    cache of just their prompts. Every row's output is still the target's greedy continuation."""
    cfg, model, _, _, _ = setup
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, cfg.target.vocab_size, (5,), generator=g).tolist() for _ in range(12)]
    max_new = [3, MAX_NEW] * 6  # slots 0, 2, 4 free together, slots 1, 3, 5 keep decoding
    refs = [model.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                           pad_token_id=0)[0, len(p):].tolist() for p, n in zip(prompts, max_new)]
    for system in ["ar", "lilicorr"]:
        dec = build_decoder(cfg, model, system, max_batch=6)
        groups = []
        inner = dec.runner._prefill_rows
        dec.runner._prefill_rows = lambda slots, *a: groups.append(list(slots)) or inner(slots, *a)
        results = dec.generate([Request(i, p, max_new_tokens=n) for i, (p, n) in enumerate(zip(prompts, max_new))])
        assert [r.output_ids for r in results] == refs, system
        assert groups[0] == list(range(6))  # the first step: one pass over a slice of slots
        assert any(len(s) > 1 and s != list(range(s[0], s[0] + len(s))) for s in groups)  # scattered slots


def test_prefill_groups_join_only_rows_of_one_shape():
    """A group shares passes: equal start, length and finality; consecutive slots unless the prompts are
    fresh (start 0); at most max_tokens // length rows."""
    from lilicorr.engine.runner import prefill_groups

    def groups(rows, max_tokens=64):  # rows: (slot, length, start, final)
        slots, lens, starts, finals = zip(*rows)
        return [[slots[i] for i in g] for g in prefill_groups(slots, [[0] * n for n in lens], starts, finals,
                                                              max_tokens)]

    assert groups([(4, 3, 0, True), (0, 3, 0, True), (2, 3, 0, True)]) == [[0, 2, 4]]  # fresh: any slots
    assert groups([(0, 3, 0, True), (1, 2, 0, True), (2, 3, 0, False)]) == [[0], [1], [2]]  # length, finality
    assert groups([(5, 3, 4, True), (6, 3, 4, True), (8, 3, 4, True)]) == [[5, 6], [8]]  # continued: a slice
    assert groups([(0, 3, 0, True), (1, 3, 4, True)]) == [[0], [1]]  # start
    assert groups([(s, 3, 0, True) for s in range(5)], max_tokens=6) == [[0, 1], [2, 3], [4]]  # token cap
    assert groups([(0, 9, 0, True), (1, 9, 0, True)], max_tokens=6) == [[0], [1]]  # a long chunk goes alone


@pytest.mark.parametrize("path", ["native", "modules"])
def test_lilicorr_at_batch_one_takes_the_chosen_head_path_and_stays_lossless(setup, path, monkeypatch):
    """One row at a time, the LiLiCorr head proposes through its C call (engine.cpu_native_head, the default;
    heads/lilicorr_native.py) or, off, its modules; the output is the target's either way."""
    from lilicorr.kernels import packed_linear
    from lilicorr.models.heads import lilicorr_native
    from lilicorr.models.heads.lilicorr import LiLiCorrHead

    monkeypatch.setattr(packed_linear, "MIN_ELEMENTS", 1 << 18)  # the head's tiny Linears stay plain (as real ones)
    cfg, model, prompts, stops, refs = setup
    calls = {"native": [], "modules": []}
    for name, module, fn in (("native", lilicorr_native, "propose_one_row"), ("modules", LiLiCorrHead, "vectors")):
        real = getattr(module, fn)
        monkeypatch.setattr(module, fn, lambda *a, _real=real, _log=calls[name], **k: _log.append(1) or _real(*a, **k))
    cfg = copy.deepcopy(cfg)  # the module's config stays as it was
    cfg.engine.cpu_native_head = path == "native"
    dec = build_decoder(cfg, model, "lilicorr", stop_ids=stops, max_batch=1)
    assert dec.runner.drafting.head_options["fast"].native is (path == "native")
    assert [r.output_ids for r in run(dec, prompts)] == refs
    assert bool(calls["native"]) is (path == "native") and lilicorr_native._LIB.failed is None
    assert bool(calls["modules"]) is (path == "modules")
