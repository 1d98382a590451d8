"""Issue 11 levers: a reduced draft vocabulary (EAGLE-3 style) and the Llama norm layout for target-layer init.

The draft vocabulary must change only what the drafter can propose: its logits outside the vocabulary are
floored, its losses are the full-vocabulary losses restricted and renormalised by hand, exports carry the
ids, and decoding stays equal to the target's greedy output.
"""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from engine_helpers import tiny_config, varied_random_target
from lilicorr.config import load_config
from lilicorr.engine.requests import Request
from lilicorr.engine.systems import build_decoder
from lilicorr.models.drafter_init import copy_target_top_layers
from lilicorr.models.joint import JointModel
from lilicorr.models.losses import slot_decay_weights
from lilicorr.models.target import build_random_target
from lilicorr.models.vocab_ranking import VOCAB_RANKING_FILE, write_vocab_ranking
from lilicorr.platform.train.data import draft_vocab_from_shards, token_ranking

pytestmark = pytest.mark.usefixtures("one_torch_thread")

V = 512
DRAFT = torch.arange(0, V, 3)[:96]  # 96 ids, every third token


def _joint(*overrides, vocab=True):
    cfg = load_config("tiny-random", [f"target.vocab_size={V}", "drafter.draft_vocab=96", *overrides])
    torch.manual_seed(0)
    joint = JointModel(cfg, build_random_target(cfg.target))
    if vocab:
        joint.drafter.set_draft_vocab(DRAFT.flip(0))  # any order in, ascending inside
    return joint


def _rows(n=2, T=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = DRAFT[torch.randint(0, DRAFT.numel(), (n, T), generator=g)]  # mostly in-vocabulary text ...
    ids[:, ::5] = 1  # ... with an out-of-vocabulary token every 5th position
    mask = torch.zeros(n, T, dtype=torch.bool)
    mask[:, 4:] = True
    return ids, mask


def test_logits_are_the_lm_head_on_the_draft_vocabulary_and_floored_elsewhere():
    d = _joint().drafter
    assert torch.equal(d.draft_ids, DRAFT)
    w = torch.randn(V, 16)
    h = torch.randn(3, 5, 16)
    full = d.logits(h, w)  # (3, 5, V)
    assert full.shape == (3, 5, V)
    assert torch.allclose(full[..., DRAFT], h @ w[DRAFT].T, atol=1e-6)
    outside = torch.ones(V, dtype=torch.bool)
    outside[DRAFT] = False
    assert (full[..., outside] < -1e30).all()
    assert d.in_draft_vocab(full.argmax(-1)).all()
    logp = F.log_softmax(full, -1)
    assert torch.isfinite(logp).all() and torch.isfinite((logp.exp() * logp).sum(-1)).all()
    assert torch.equal(d.draft_index(DRAFT[[0, 7, 95]]), torch.tensor([0, 7, 95]))


def test_set_draft_vocab_rejects_wrong_sizes_and_ids():
    d = _joint(vocab=False).drafter
    assert d.vocab_source == "default" and torch.equal(d.draft_ids, torch.arange(96))  # valid until set
    with pytest.raises(ValueError, match="96"):
        d.set_draft_vocab(torch.arange(10))
    with pytest.raises(ValueError, match="must lie in"):
        d.set_draft_vocab(torch.arange(V - 95, V + 1))


@pytest.mark.parametrize("head", ["none", "lilicorr"])
def test_dflash_loss_is_the_restricted_renormalised_loss_by_hand(head):
    """Chunked (head none) and full-logit (LiLiCorr) paths both equal Eq. 6 over the draft vocabulary:
    out-of-vocabulary labels carry no CE, soft labels are the target's distribution renormalised on it."""
    joint = _joint(f"head.kind={head}", "train.distill=0.5", "train.labels=corpus", "train.ce_chunk_rows=7")
    ids, mask = _rows()
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731 - the same anchors for both passes
    out = joint(ids, mask, generator=g(), with_metrics=False)
    batch = joint.build_batch(ids, mask, generator=g())
    W = joint.target.lm_head_weight
    logits = batch.slot_hidden @ W[DRAFT].T  # (C, S, 96) by hand
    assert torch.equal(batch.vocab_ids, DRAFT)  # a compact batch: columns are the draft vocabulary
    tlogits = batch.target_logits  # (C, S, 96): the target's logits at the draft vocabulary's columns
    assert torch.allclose(batch.slot_logits, logits, atol=1e-5)
    in_vocab = torch.isin(batch.labels, DRAFT)
    assert (~in_vocab & batch.valid).any() and (in_vocab & batch.valid).any()
    logp = F.log_softmax(logits, -1)
    hard = -logp.gather(-1, torch.searchsorted(DRAFT, batch.labels).clamp_max(95)[..., None])[..., 0]
    soft = -(F.softmax(tlogits, -1) * logp).sum(-1)
    w = slot_decay_weights(logits.shape[1], joint.cfg.drafter.loss_decay_beta)[None] * (batch.valid & in_vocab)
    expected = ((0.5 * hard + 0.5 * soft) * w).sum() / w.sum()
    assert torch.allclose(out.terms["dflash"], expected, rtol=1e-5, atol=1e-5)


def test_compact_batch_gives_the_full_vocabulary_losses_and_metrics():
    """LiLiCorr on logits over the draft vocabulary only (compact) = on full-vocabulary logits with floors:
    the same DFlash, CE and margin terms, metrics and gradients (the distractor term's q is renormalised over
    the draft vocabulary in the compact form, so λ = 0 here)."""
    outs, grads = [], []
    for compact in (True, False):
        joint = _joint("head.kind=lilicorr", "train.distill=0.5", "loss.lam=0.0", "head.top_k=48")  # K: oracle slots exist
        joint.head.compact_vocab = compact
        ids, mask = _rows()
        out = joint(ids, mask, generator=torch.Generator().manual_seed(5))
        out.loss.backward()
        outs.append(out)
        grads.append(torch.cat([p.grad.flatten() for p in joint.parameters() if p.grad is not None]))
    (a, b) = outs
    for k in ("dflash", "ce", "margin"):
        assert torch.allclose(a.terms[k], b.terms[k], rtol=1e-5, atol=1e-6), k
    assert torch.allclose(a.loss, b.loss, rtol=1e-5, atol=1e-6)
    assert a.metrics.keys() == b.metrics.keys(), (a.metrics.keys(), b.metrics.keys())
    assert a.metrics["oracle_slots"] > 0, a.metrics
    for k in a.metrics:
        assert a.metrics[k] == pytest.approx(b.metrics[k], rel=1e-5, abs=1e-6), k
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("head", ["none", "lilicorr", "domino", "dspark"])
def test_every_head_trains_with_a_draft_vocabulary(head):
    """Finite loss and gradients, and no proposal outside the draft vocabulary, for every head."""
    joint = _joint(f"head.kind={head}", "train.distill=0.5")
    ids, mask = _rows()
    out = joint(ids, mask, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(out.loss)
    out.loss.backward()
    grads = [p.grad for p in joint.drafter.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    with torch.no_grad():
        batch = joint.build_batch(ids, mask, generator=torch.Generator().manual_seed(0))
        full = joint.drafter.logits(batch.slot_hidden, joint.target.lm_head_weight)  # the engine's logits
        prop = joint.head.propose(full, batch.slot_hidden, batch.target_state, batch.anchor_ids)
    assert joint.drafter.in_draft_vocab(prop.tokens).all()


def test_export_carries_the_draft_vocabulary_and_decoding_stays_lossless(tmp_path):
    g = torch.Generator().manual_seed(1)
    model, vocab = None, None
    for head, systems in [("none", ["dflash", "ddtree"]), ("lilicorr", ["lilicorr", "lilicorr-viterbi"]),
                          ("domino", ["domino"]), ("dspark", ["dspark"])]:
        cfg = tiny_config("llama", overrides=["drafter.draft_vocab=200", f"head.kind={head}"])
        if model is None:
            model = varied_random_target(cfg, seed=11)
            vocab = torch.randperm(cfg.target.vocab_size, generator=g)[:200]
            prompts = [torch.randint(0, cfg.target.vocab_size, (n,), generator=g).tolist() for n in (3, 8, 1)]
            refs = [model.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False, eos_token_id=None,
                                   pad_token_id=0)[0, len(p):].tolist() for p in prompts]
        joint = JointModel(cfg, model)
        joint.drafter.set_draft_vocab(vocab)
        joint.export(tmp_path / head)
        loaded = JointModel.load_exported(tmp_path / head, model)
        assert torch.equal(loaded.drafter.draft_ids, vocab.sort().values)
        for system in systems:
            dec = build_decoder(cfg, model, system, checkpoint=str(tmp_path / head), max_batch=2)
            results = dec.generate([Request(i, p, max_new_tokens=10) for i, p in enumerate(prompts)])
            assert [r.output_ids for r in results] == refs, system
            assert all(r.error is None for r in results)


def test_init_from_a_full_vocabulary_export_keeps_this_runs_vocabulary(tmp_path):
    full = _joint("head.kind=none", "drafter.draft_vocab=0", vocab=False)
    full.export(tmp_path / "full")
    reduced = _joint("head.kind=none")
    assert "drafter" in reduced.init_from_export(tmp_path / "full")
    assert torch.equal(reduced.drafter.draft_ids, DRAFT) and reduced.drafter.vocab_source == "data"
    assert torch.equal(reduced.drafter.fc.weight, full.drafter.fc.weight)
    reduced.export(tmp_path / "reduced")
    again = _joint("head.kind=none", vocab=False)
    again.init_from_export(tmp_path / "reduced")  # the export's vocabulary wins over this run's data
    assert torch.equal(again.drafter.draft_ids, DRAFT) and again.drafter.vocab_source == "export"
    said = full.init_from_export(tmp_path / "reduced")  # drafter.draft_vocab=0: continued over the full vocabulary
    assert "draft vocabulary dropped" in said[0] and full.drafter.draft_ids is None


def test_full_vocab_conversion_is_the_export_without_its_vocabulary(tmp_path):
    """jobs/export.py --layout lilicorr --convert full-vocab: the same weights and head, no draft ids, the config
    saying so; it loads as the model a drafter.draft_vocab=0 run continuing the export starts from."""
    from lilicorr.platform.export_layouts import export_layout

    reduced = _joint("head.kind=lilicorr")
    reduced.export(tmp_path / "reduced")
    (tmp_path / "reduced" / "side.json").write_text("{}")
    warnings = export_layout("lilicorr", str(tmp_path / "reduced"), str(tmp_path / "full"), convert=["full-vocab"])
    assert "96-token draft vocabulary" in warnings[0] and (tmp_path / "full" / "side.json").is_file()
    started = _joint("head.kind=lilicorr", "drafter.draft_vocab=0", vocab=False)
    started.init_from_export(tmp_path / "reduced")
    loaded = JointModel.load_exported(tmp_path / "full", started.target.hf)
    assert loaded.drafter.draft_ids is None and loaded.cfg.drafter.draft_vocab == 0
    for a, b in [(loaded.drafter, started.drafter), (loaded.head, started.head)]:
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    meta = json.loads((tmp_path / "full" / "config.json").read_text())
    assert meta["converted"]["full-vocab"] == warnings[0] and meta["config"]["drafter"]["draft_vocab"] == 0
    with pytest.raises(ValueError, match="full-vocabulary export already"):
        export_layout("lilicorr", str(tmp_path / "full"), str(tmp_path / "again"), convert=["full-vocab"])
    with pytest.raises(ValueError, match="full-vocab only"):
        export_layout("lilicorr", str(tmp_path / "reduced"), str(tmp_path / "x"), convert=["shared-slot-bias"])


def test_draft_vocabulary_from_shards_counts_supervised_tokens_only(tmp_path):
    (tmp_path / "train").mkdir()
    rows = {"id": ["a", "b"],
            "input_ids": [[5, 5, 9, 9, 9, 2], [7, 7, 7, 7, 2, 3]],
            "loss_mask": [[0, 1, 1, 1, 1, 1], [1, 1, 1, 0, 1, 1]]}  # supervised: 5x1 9x3 2x2 7x3 3x1
    pq.write_table(pa.table(rows), tmp_path / "train" / "shard-00000.parquet")
    files = [str(tmp_path / "train" / "shard-00000.parquet")]
    assert draft_vocab_from_shards(files, 3) == [2, 7, 9]  # 9 and 7 (3 each), then 2 (2)
    assert draft_vocab_from_shards(files, 4) == [2, 3, 7, 9]  # 3 and 5 tie at 1: the lower id
    assert draft_vocab_from_shards(files, 7) == [0, 1, 2, 3, 5, 7, 9]  # all 5 seen, then the lowest unseen


def test_llama_layout_drafter_copies_every_tensor_of_the_targets_top_layers():
    cfg = load_config("tiny-random", ["target.arch=llama", "drafter.qk_norm=false", "drafter.init=target_top"])
    torch.manual_seed(0)
    hf = build_random_target(cfg.target)
    joint = JointModel(cfg, hf)
    layer = joint.drafter.layers[-1]
    assert not any("q_norm" in k or "k_norm" in k for k in layer.state_dict())
    fresh = JointModel(load_config("tiny-random", ["target.arch=llama", "drafter.qk_norm=false"]), hf).drafter
    n = sum(len(l.state_dict()) for l in fresh.layers)
    assert copy_target_top_layers(fresh, hf) == n  # nothing of the drafter's layers left at its own init
    src = hf.model.layers[-1].state_dict()
    for k, v in layer.state_dict().items():
        assert torch.equal(v, src[k]), k


def test_exports_with_qk_norms_still_load_when_the_preset_drops_them(tmp_path):
    old = _joint("head.kind=none", "drafter.draft_vocab=0", vocab=False)  # qk_norm=True: the old layout
    old.export(tmp_path / "old")
    loaded = JointModel.load_exported(tmp_path / "old", old.target.hf)
    assert loaded.cfg.drafter.qk_norm and torch.equal(loaded.drafter.layers[0].self_attn.q_norm.weight,
                                                      old.drafter.layers[0].self_attn.q_norm.weight)


def test_gathered_lm_weight_follows_a_new_vocabulary():
    """The drafter caches its LM-head rows; a new vocabulary (set or loaded in place) must not read stale rows."""
    d = _joint().drafter
    w = torch.randn(V, 16)
    first = d.draft_lm_weight(w).clone()
    d.load_state_dict({**d.state_dict(), "draft_ids": torch.arange(96)})  # in place, same storage
    assert torch.equal(d.draft_lm_weight(w), w[:96]) and not torch.equal(first, w[:96])


@pytest.mark.parametrize("head,system", [("none", "dflash"), ("lilicorr", "lilicorr"), ("lilicorr", "lilicorr-viterbi")])
def test_engine_proposals_from_draft_vocabulary_logits_equal_those_from_full_logits(tmp_path, head, system):
    """The engine hands a compact_vocab head logits over the draft vocabulary only (+ vocab_ids) and LiLiCorr
    the drafter's fused context it already computed: the proposals must be those of full-vocabulary floored
    logits and the head's own fuse_context, block by block."""
    g = torch.Generator().manual_seed(2)
    cfg = tiny_config("llama", overrides=["drafter.draft_vocab=200", f"head.kind={head}"])
    model = varied_random_target(cfg, seed=11)
    joint = JointModel(cfg, model)
    joint.drafter.set_draft_vocab(torch.randperm(cfg.target.vocab_size, generator=g)[:200])
    joint.export(tmp_path / head)
    prompts = [torch.randint(0, cfg.target.vocab_size, (n,), generator=g).tolist() for n in (3, 8, 5)]
    proposals, outputs = {}, {}
    for fast in (True, False):
        dec = build_decoder(cfg, model, system, checkpoint=str(tmp_path / head), max_batch=2)
        d = dec.runner.drafting
        assert d.vocab_ids is not None and (d.context_state is not None) == (head == "lilicorr")
        if not fast:
            d.vocab_ids, d.context_state = None, None
        seen, propose = [], d.propose

        def spy(rows, slot_logits, *rest, _propose=propose, _seen=seen, _d=d):
            assert slot_logits.shape[-1] == (200 if _d.vocab_ids is not None else cfg.target.vocab_size)
            p = _propose(rows, slot_logits, *rest)
            _seen.append(p.tokens.clone())
            return p

        d.propose = spy
        results = dec.generate([Request(i, p, max_new_tokens=12) for i, p in enumerate(prompts)])
        proposals[fast], outputs[fast] = seen, [r.output_ids for r in results]
    assert len(proposals[True]) == len(proposals[False]) > 3
    assert all(torch.equal(a, b) for a, b in zip(proposals[True], proposals[False]))
    assert outputs[True] == outputs[False]


def test_token_ranking_orders_supervised_tokens_by_count_then_id(tmp_path):
    (tmp_path / "train").mkdir()
    rows = {"id": ["a"], "input_ids": [[5, 9, 9, 7, 7, 3, 5, 1]], "loss_mask": [[1, 1, 1, 1, 1, 1, 1, 0]]}
    pq.write_table(pa.table(rows), tmp_path / "train" / "shard-00000.parquet")
    assert token_ranking([str(tmp_path / "train" / "shard-00000.parquet")]) == ([5, 7, 9, 3], [2, 2, 2, 1])


def _full_vocab_export(tmp_path, head: str, ranking: torch.Tensor):
    cfg = tiny_config("llama", overrides=["drafter.draft_vocab=0", f"head.kind={head}"])
    model = varied_random_target(cfg, seed=11)
    JointModel(cfg, model).export(tmp_path / head)
    write_vocab_ranking(tmp_path / head, ranking, torch.arange(ranking.numel(), 0, -1))
    return cfg, model, str(tmp_path / head)


@pytest.mark.parametrize("head,system", [("none", "dflash"), ("lilicorr", "lilicorr")])
def test_run_time_draft_vocabulary_proposes_from_the_rankings_top_tokens_losslessly(tmp_path, head, system):
    """engine.draft_vocab=N on a full-vocabulary export: the drafter's logits (and so every proposal) come from
    the ranking's first N tokens, the plan says so, the export itself stays full-vocabulary, and the output is
    still the target's greedy one."""
    g = torch.Generator().manual_seed(3)
    V = tiny_config("llama").target.vocab_size
    ranking = torch.randperm(V, generator=g)[:150]
    cfg, model, path = _full_vocab_export(tmp_path, head, ranking)
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (3, 8)]
    refs = [model.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False, eos_token_id=None,
                           pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    cfg.engine.draft_vocab = 100
    dec = build_decoder(cfg, model, system, checkpoint=path, max_batch=2)
    assert dec.backend_plan.draft_vocab == f"100 of {V} run-time"
    seen = []
    dec.runner.drafting.observers.append(lambda o: seen.append(o.proposal.tokens.clone()))
    results = dec.generate([Request(i, p, max_new_tokens=10) for i, p in enumerate(prompts)])
    assert [r.output_ids for r in results] == refs
    drafted = torch.cat([t.flatten() for t in seen])
    assert drafted.numel() > 0 and torch.isin(drafted, ranking[:100]).all()
    assert "drafter.draft_ids" not in safe_open_keys(path)
    cfg.engine.draft_vocab = 0
    assert build_decoder(cfg, model, system, checkpoint=path, max_batch=2).backend_plan.draft_vocab == f"full {V}"


def test_run_time_draft_vocabulary_says_where_it_does_not_apply(tmp_path):
    """Like an engine lever that cannot run here: the drafter keeps its own vocabulary and the plan says why; a
    ranking shorter than N gives all of it; N outside [1, V) is an error."""
    V = tiny_config("llama").target.vocab_size
    cfg, model, path = _full_vocab_export(tmp_path, "none", torch.arange(50))
    cfg.engine.draft_vocab = 60
    assert build_decoder(cfg, model, "dflash", checkpoint=path).backend_plan.draft_vocab == f"50 of {V} run-time"
    cfg.engine.draft_vocab = V
    with pytest.raises(ValueError, match=r"must lie in \[1, "):
        build_decoder(cfg, model, "dflash", checkpoint=path)
    cfg.engine.draft_vocab = 20
    said = build_decoder(cfg, model, "dflash").backend_plan.draft_vocab
    assert said.startswith(f"full {V} (engine.draft_vocab=20 not applied: a random drafter")
    (tmp_path / "none" / VOCAB_RANKING_FILE).unlink()
    said = build_decoder(cfg, model, "dflash", checkpoint=path).backend_plan.draft_vocab
    assert said.startswith(f"full {V} (engine.draft_vocab=20 not applied: the export has no {VOCAB_RANKING_FILE}")
    reduced = tiny_config("llama", overrides=["drafter.draft_vocab=200", "head.kind=none"])
    JointModel(reduced, model).export(tmp_path / "reduced")
    said = build_decoder(cfg, model, "dflash", checkpoint=str(tmp_path / "reduced")).backend_plan.draft_vocab
    assert said == "200 trained (engine.draft_vocab=20 not applied: its trained draft vocabulary is larger and has no ranking)"
    cfg.engine.draft_vocab = 300
    assert build_decoder(cfg, model, "dflash", checkpoint=str(tmp_path / "reduced")).backend_plan.draft_vocab == "200 trained"


def safe_open_keys(path: str) -> set[str]:
    from safetensors import safe_open

    with safe_open(f"{path}/model.safetensors", "pt") as f:
        return set(f.keys())
