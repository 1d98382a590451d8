"""Every head's loss in checkpointed row chunks (models/slot_rows.py): the same values and gradients as the dense
formulas on (blocks, slots, V) logits, no (blocks, slots, V) tensor ever built, and bf16 end to end."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lilicorr.config import load_config
from lilicorr.kernels.topk_logsoftmax import topk_logsoftmax_reference
from lilicorr.models import losses
from lilicorr.models.joint import JointModel
from lilicorr.models.target import build_random_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HEADS = ["none", "lilicorr", "domino", "dspark"]


def joint(kind, *extra):
    cfg = load_config("tiny-random", [f"head.kind={kind}", "drafter.anchors_per_seq=12", *extra])
    torch.manual_seed(0)
    m = JointModel(cfg, build_random_target(cfg.target))
    if kind == "domino":  # a residual that matters
        torch.nn.init.normal_(m.head.residual[2].weight, std=0.3)
    if kind == "dspark":
        torch.nn.init.normal_(m.head.w2.weight, std=0.3)
    return m


def data(cfg, N=2, T=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 400, (N, T), generator=g)  # a small id range: labels repeat, oracle prefixes form
    mask = torch.ones(N, T, dtype=torch.bool)
    mask[1, 30:] = False  # partly masked blocks
    return ids, mask


def reference_loss(m: JointModel, b) -> torch.Tensor:
    """The heads' objectives written out on dense logits with the losses.py primitives (the pre-chunking code)."""
    beta, distill, kind = m.cfg.drafter.loss_decay_beta, m.cfg.train.distill, m.cfg.head.kind
    dflash = losses.dflash_loss_distilled(b.slot_logits, b.label_columns(), b.ce_valid(), beta,
                                          b.soft_label_logits(b.target_logits), distill)
    if kind == "none":
        return dflash
    if kind == "lilicorr":
        C, S, V = b.slot_logits.shape
        cand, g_idx, prefix, z = m.head._teacher_forced(b)
        cols = topk_logsoftmax_reference(b.slot_logits.reshape(C * S, V), m.head.K).ids.view(C, S, -1)
        logq = torch.log_softmax(b.target_logits.float(), -1).gather(-1, cols)
        return losses.lilicorr_objective(dflash, losses.lilicorr_ce(z, g_idx, prefix),
                                         losses.distractor_penalty(z, g_idx, logq, prefix),
                                         losses.margin_loss(z, g_idx, prefix, m.cfg.loss.rho), m.cfg.loss)
    if kind == "domino":
        lam = 1.0 - b.progress
        return (1 - lam) * losses.dflash_loss(m.head._teacher_forced(b), b.labels, b.ce_valid(), beta) + lam * dflash
    prev = torch.cat([b.anchor_ids[:, None], b.labels[:, :-1].clamp_min(0)], 1)  # dspark
    logits, conf = m.head.step(b.slot_logits, b.slot_hidden, prev)
    mk = losses.cumulative_mask(b.valid).float()
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), b.labels.flatten().clamp_min(0),
                                           reduction="none").view_as(mk)
    l1 = (torch.softmax(logits.float(), -1) - torch.softmax(b.target_logits.float(), -1)).abs().sum(-1)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(conf.float(), (1 - 0.5 * l1).clamp(0, 1).detach(),
                                                               reduction="none")
    n, m_ce = mk.sum().clamp_min(1), mk * b.ce_valid().float()  # no CE on labels outside a draft vocabulary
    return 0.1 * (ce * m_ce).sum() / m_ce.sum().clamp_min(1) + 0.9 * (l1 * mk).sum() / n + (bce * mk).sum() / n


def grads(m):
    out = {n: p.grad.clone() for n, p in [*m.drafter.named_parameters(), *m.head.named_parameters()]
           if p.grad is not None}
    m.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("kind", HEADS)
@pytest.mark.parametrize("extra", [(), ("train.distill=0.5", "drafter.draft_vocab=96")], ids=["plain", "distill-vocab"])
def test_chunked_loss_equals_the_dense_formulas_in_value_and_gradient(kind, extra):
    m = joint(kind, "train.ce_chunk_rows=7", *extra)  # 7: chunks that split blocks and leave a ragged tail
    if m.drafter.draft_ids is not None:
        m.drafter.set_draft_vocab(torch.arange(0, 400, 4)[:96])
    ids, mask = data(m.cfg)
    chunked = m(ids, mask, generator=torch.Generator().manual_seed(3), progress=0.4, with_metrics=False)
    chunked.loss.backward()
    g_chunked = grads(m)
    dense = m.build_batch(ids, mask, torch.Generator().manual_seed(3), progress=0.4)
    assert dense.slot_logits.shape[:2] == dense.labels.shape and dense.labels.shape[0] > 20
    want = reference_loss(m, dense)
    want.backward()
    g_dense = grads(m)
    assert chunked.loss.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-6)
    assert set(g_chunked) == set(g_dense) and len(g_dense) > 5
    for name in g_dense:
        assert torch.allclose(g_chunked[name], g_dense[name], rtol=1e-4, atol=1e-6), name
    assert all(p.grad is None for p in m.target.parameters())


@pytest.mark.parametrize("kind", HEADS)
def test_metrics_over_block_chunks_equal_one_dense_pass(kind):
    m = joint(kind)
    ids, mask = data(m.cfg)
    m.eval()
    with torch.no_grad():
        small = JointModel._metrics(m, m._build(ids, mask, torch.Generator().manual_seed(1)))
        m.cfg.train.ce_chunk_rows = 10**6
        whole = JointModel._metrics(m, m._build(ids, mask, torch.Generator().manual_seed(1)))
    assert small.keys() == whole.keys() and "sim_acceptance_length" in small
    for k in whole:
        assert small[k] == pytest.approx(whole[k], abs=1e-9), k


class LargestTensor(TorchDispatchMode):
    """Records the element count of the largest tensor any operator creates."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("kind", HEADS)
def test_no_blocks_by_slots_by_vocabulary_tensor_is_ever_built(kind):
    # 2 rows x up to 48 anchors x 3 slots (~230 (block, slot) rows) over V = 49,152: a (C, S, V) tensor has ~11M
    # elements; chunks of 16 rows stay at 16 x V = 0.79M, and the largest other tensor is the LM head (V x H = 3.1M).
    m = joint(kind, "train.ce_chunk_rows=16", "drafter.anchors_per_seq=48")
    ids, mask = data(m.cfg, T=64)
    V, H = m.target.vocab_size, m.target.hidden_size
    with LargestTensor() as seen:
        out = m(ids, mask, generator=torch.Generator().manual_seed(0))  # metrics included
        out.loss.backward()
    rows = out.metrics["blocks"] * (m.block_size - 1)
    assert rows * V > 2 * V * H  # the test can tell the two apart
    assert seen.largest <= max(16 * V, V * H), (seen.largest, rows * V)


@pytest.mark.parametrize("kind", HEADS)
@pytest.mark.parametrize("target_dtype", ["bfloat16", "float32"])
def test_bf16_drafter_and_head_train_on_a_bf16_or_fp32_target(kind, target_dtype):
    # DeepSpeed bf16 holds the module (drafter + head) in bf16; the frozen target keeps its own dtype.
    cfg = load_config("tiny-random", [f"head.kind={kind}", f"target.dtype={target_dtype}", "target.arch=qwen3",
                                      "train.ce_chunk_rows=11", "drafter.mask=token"])
    torch.manual_seed(0)
    m = JointModel(cfg, build_random_target(cfg.target))
    m.drafter.to(torch.bfloat16)
    m.head.to(torch.bfloat16)
    ids, mask = data(cfg)
    out = m(ids, mask, generator=torch.Generator().manual_seed(0))
    out.loss.backward()
    assert torch.isfinite(out.loss) and out.metrics["sim_acceptance_length"] >= 1.0
    assert all(p.grad is not None and p.grad.dtype == torch.bfloat16 and torch.isfinite(p.grad).all()
               for p in m.drafter.parameters() if p.requires_grad)
    head_grads = [p.grad for p in m.head.parameters()]  # in the graph (zero where no oracle prefix formed)
    assert all(g is not None and g.dtype == torch.bfloat16 and torch.isfinite(g).all() for g in head_grads)
