"""Heads and the joint model: parameter count, gradients across top-K, proposals, baselines, export."""

import pytest
import torch

from lilicorr.config import load_config
from lilicorr.kernels.lattice import decode_reference
from lilicorr.models import losses
from lilicorr.models.decode import commit_tokens
from lilicorr.models.heads import LiLiCorrHead
from lilicorr.models.joint import JointModel, load_drafter_and_head
from lilicorr.models.target import build_random_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PAPER_PARAMS = {"qwen3-8b": (4096, 36.76e6), "qwen3-4b": (2560, 32.04e6)}  # (target hidden, Table 4)


def joint(kind="lilicorr", extra=()):
    cfg = load_config("tiny-random", [f"head.kind={kind}", *extra])
    torch.manual_seed(0)
    return JointModel(cfg, build_random_target(cfg.target))


def batch_of(m, ids, mask, gen):
    out = m.build_batch(ids, mask, gen)
    return out[0] if isinstance(out, tuple) else out  # (HeadBatch, parts) since the chunked DFlash loss


def data(cfg, N=2, T=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.target.vocab_size, (N, T), generator=g)
    return ids, torch.ones(N, T, dtype=torch.bool)


@pytest.mark.parametrize("preset", ["qwen3-8b", "qwen3-4b"])
def test_lilicorr_param_count_matches_table_4(preset):
    cfg = load_config(preset)
    hidden, paper = PAPER_PARAMS[preset]
    with torch.device("meta"):  # no 8B target, no memory: shapes only
        head = LiLiCorrHead(cfg.head, cfg.loss, hidden, hidden, cfg.drafter.num_layers, cfg.drafter.block_size)
    count = sum(p.numel() for p in head.parameters())
    assert abs(count - paper) / paper < 0.05
    assert round(count / 1e6, 2) == round(paper / 1e6, 2)  # in fact equal to the paper's two decimals


def test_ce_alone_trains_drafter_through_logprobs_and_hidden_not_target():
    m = joint()
    ids, mask = data(m.cfg)
    batch = batch_of(m, ids, mask, torch.Generator().manual_seed(0))
    batch.slot_logits.retain_grad()
    batch.slot_hidden.retain_grad()
    # Make every slot covered so the oracle prefix is full: labels = the drafter's own top-1.
    batch.labels = batch.slot_logits.argmax(-1).detach()
    batch.valid = torch.ones_like(batch.valid)
    cand, g_idx, prefix, z = m.head._teacher_forced(batch)
    assert prefix.all()
    losses.lilicorr_ce(z, g_idx, prefix).backward()
    assert batch.slot_logits.grad.abs().sum() > 0  # through the candidates' log-probs (features)
    assert batch.slot_hidden.grad.abs().sum() > 0
    for name, p in m.drafter.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert all(p.grad is None for p in m.target.parameters())


def test_lilicorr_propose_is_the_walk_over_its_scores():
    for rule, extra in [("greedy", ()), ("viterbi", ("head.decode_rule=viterbi",))]:
        m = joint(extra=extra).eval()
        ids, mask = data(m.cfg)
        with torch.no_grad():
            b = batch_of(m, ids, mask, torch.Generator().manual_seed(1))
            prop = m.head.propose(b.slot_logits, b.slot_hidden, b.target_state, b.anchor_ids)
            cand, anchor, pair, *_ = m.head.scores(b.slot_logits, b.slot_hidden, b.target_state, True)
        S = m.block_size - 1
        assert prop.tokens.shape == (b.slot_logits.shape[0], S) and prop.num_proposed.eq(S).all()
        assert torch.equal(cand, b.slot_logits.topk(m.cfg.head.top_k, dim=-1).indices)
        assert torch.equal(prop.tokens, commit_tokens(cand, decode_reference(anchor, pair, rule)))


def test_vanilla_head_is_per_slot_argmax_and_dflash_loss():
    m = joint("none")
    ids, mask = data(m.cfg)
    out = m(ids, mask, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out.loss.detach(), out.terms["dflash"]) and m.param_groups(m.cfg.optim)[0]["name"] == "drafter"
    b = batch_of(m, ids, mask, torch.Generator().manual_seed(0))
    assert torch.equal(m.head.propose(b.slot_logits, b.slot_hidden, b.target_state, b.anchor_ids).tokens,
                       b.slot_logits.argmax(-1))


def test_domino_sequential_matches_teacher_forced_and_lambda_decays():
    m = joint("domino")
    torch.nn.init.normal_(m.head.residual[2].weight, std=0.5)  # a non-trivial residual
    ids, mask = data(m.cfg)
    b = batch_of(m, ids, mask, torch.Generator().manual_seed(0))
    with torch.no_grad():
        prop = m.head.propose(b.slot_logits, b.slot_hidden, b.target_state, b.anchor_ids)
        tf = m.head.corrected_logits(b.slot_logits, b.slot_hidden, b.anchor_ids, prop.tokens[:, :-1])
    assert torch.equal(prop.tokens[:, 0], b.slot_logits[:, 0].argmax(-1))  # slot 1 uncorrected
    assert torch.equal(tf.argmax(-1), prop.tokens)  # one pass per slot == teacher-forced on its own prefix
    assert not torch.equal(prop.tokens, b.slot_logits.argmax(-1))
    d = losses.dflash_loss(b.slot_logits, b.labels, b.valid, m.cfg.drafter.loss_decay_beta)
    b.progress = 0.0
    out = m.head.loss(b)
    assert torch.allclose(out.terms["dflash"], d) and torch.allclose(out.loss, d)
    want_final = losses.dflash_loss(m.head._teacher_forced(b), b.labels, b.valid, m.cfg.drafter.loss_decay_beta)
    assert torch.allclose(out.terms["ce_final"], want_final)
    b.progress = 1.0
    out = m.head.loss(b)
    assert torch.allclose(out.loss, out.terms["ce_final"])
    b.progress = 0.25
    out = m.head.loss(b)
    assert torch.allclose(out.loss, 0.25 * out.terms["ce_final"] + 0.75 * d)


def test_dspark_loss_terms_and_cutoff():
    m = joint("dspark")
    ids, mask = data(m.cfg)
    b = batch_of(m, ids, mask, torch.Generator().manual_seed(0))
    out = m.head.loss(b)
    with torch.no_grad():
        prev = torch.cat([b.anchor_ids[:, None], b.labels[:, :-1]], 1)
        logits, _ = m.head.step(b.slot_logits, b.slot_hidden, prev)
        p, q = torch.softmax(logits, -1), torch.softmax(b.target_logits, -1)
        keep = torch.cumprod(b.valid.long(), 1).bool()
        l1 = (p - q).abs().sum(-1)[keep].mean()
    assert out.terms["l1"].item() == pytest.approx(l1.item(), rel=1e-4)
    want = 0.1 * out.terms["ce"] + 0.9 * out.terms["l1"] + 1.0 * out.terms["bce"]
    assert out.loss.item() == pytest.approx(want.item(), rel=1e-6)
    with torch.no_grad():
        torch.nn.init.normal_(m.head.confidence.weight, std=0.3)
        prop = m.head.propose(b.slot_logits, b.slot_hidden, b.target_state, b.anchor_ids)
    conf = prop.extra["confidence"]
    for c in range(conf.shape[0]):
        low = (conf[c] < m.head.threshold).nonzero()
        assert prop.num_proposed[c].item() == (low[0, 0].item() if len(low) else conf.shape[1])
    assert 0 < prop.num_proposed.float().mean() < conf.shape[1]  # the test exercises both cases


def test_dspark_sampled_contract_returns_q():
    m = joint("dspark", ("head.dspark_proposal=sampled",))
    ids, mask = data(m.cfg)
    with torch.no_grad():
        b = batch_of(m, ids, mask, torch.Generator().manual_seed(0))
        prop = m.head.propose(b.slot_logits, b.slot_hidden, b.target_state, b.anchor_ids, temperature=1.0,
                              generator=torch.Generator().manual_seed(0))
    C, S, V = b.slot_logits.shape
    assert prop.q_probs.shape == (C, S, V)
    assert torch.allclose(prop.q_probs.sum(-1), torch.ones(C, S), atol=1e-4)
    assert (prop.q_probs.gather(-1, prop.tokens[..., None]) > 0).all()
    assert not torch.equal(prop.tokens, b.slot_logits.argmax(-1))  # sampled, not greedy


def test_joint_terms_metrics_groups_and_export_roundtrip(tmp_path):
    m = joint(extra=("loss.mu=0.5",))
    ids, mask = data(m.cfg)
    out = m(ids, mask, generator=torch.Generator().manual_seed(0))
    assert set(out.terms) >= {"dflash", "ce", "dist", "margin"}
    for k in ("per_slot_accuracy", "oracle_prefix_coverage", "sim_acceptance_length"):
        assert k in out.metrics
    assert 1.0 <= out.metrics["sim_acceptance_length"] <= m.block_size
    groups = m.param_groups(m.cfg.optim)
    assert [(g["name"], g["lr"], g["weight_decay"]) for g in groups] == [
        ("drafter", 6e-4, 0.0), ("head", 1.5e-4, 0.01)]
    m.export(tmp_path)
    from safetensors.torch import load_file

    keys = load_file(str(tmp_path / "model.safetensors")).keys()
    assert keys and all(k.startswith(("drafter.", "head.")) for k in keys)
    m2 = JointModel.load_exported(tmp_path, m.target.hf)
    out2 = m2(ids, mask, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(out.loss, out2.loss)
    drafter, head, cfg = load_drafter_and_head(tmp_path, m.target)
    assert cfg.loss.mu == 0.5 and drafter.mask_token_id == m.drafter.mask_token_id
    for (k, v), v2 in zip(m.head.state_dict().items(), head.state_dict().values()):
        assert torch.equal(v, v2), k


@pytest.mark.parametrize("kind", ["lilicorr", "none", "domino", "dspark"])
def test_rows_without_an_eligible_anchor_give_zero_loss_not_a_crash(kind):
    m = joint(kind, ("target.vocab_size=512",))
    ids, mask = data(m.cfg, T=12)
    out = m(ids, torch.zeros_like(mask), generator=torch.Generator().manual_seed(0))
    assert out.loss.item() == 0.0 and out.metrics["blocks"] == 0.0
    out.loss.backward()


def test_the_lilicorr_head_keeps_no_inference_state():
    """Two HeadInferences over one head (two decoders) each keep their own tables; the head's attributes are the
    same before and after proposals through both, and a call without one runs the modules. (Each path against the
    modules: tests/parity/test_parity_lilicorr_head.py.)"""
    from lilicorr.models.heads import lilicorr_native
    from lilicorr.models.heads.lilicorr_inference import HeadInference

    m = joint().eval()
    keys = set(m.head.__dict__)
    a, b = HeadInference(native=True), HeadInference(native=True)
    g = torch.Generator().manual_seed(2)
    C, S, V = 1, m.block_size - 1, m.cfg.target.vocab_size  # one row: what the C call takes
    args = (torch.randn(C, S, V, generator=g) * 3, torch.randn(C, S, m.drafter.hidden_size, generator=g),
            torch.randn(C, len(m.target.capture_ids) * m.cfg.target.hidden_size, generator=g),
            torch.zeros(C, dtype=torch.long))
    with torch.no_grad():
        ta, tb, ref = m.head.propose(*args, fast=a), m.head.propose(*args, fast=b), m.head.propose(*args)
    assert set(m.head.__dict__) == keys
    if lilicorr_native.available():  # else both ran the modules
        assert a.native_plan is not None and b.native_plan is not None and a.native_plan is not b.native_plan
    assert torch.equal(ta.tokens, ref.tokens) and torch.equal(tb.tokens, ref.tokens)
