"""Single-process smoke on tiny-random: joint training lowers every loss term, and LiLiCorr beats the
drafter's own argmax where the block is ambiguous per slot but determined jointly (the paper's claim
in miniature).

Corpus: units [P, t1, t2, t3] where P is a random "context" token and (t1, t2, t3) is block A or block B
with equal probability. From an anchor at P every slot is a 50/50 marginal for the drafter (its block is
[P, MASK, MASK, MASK] and the context says nothing about the coin), but once slot 1 is fixed the rest
of the block is determined - which only a head that correlates slots can use.
"""

import time

import pytest
import torch

from lilicorr.config import load_config
from lilicorr.models.joint import JointModel
from lilicorr.models.target import build_random_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEPS = 300
TERMS = ("dflash", "ce", "dist", "margin")


def two_block_corpus(n: int, T: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    block_a = torch.tensor([vocab // 4, vocab // 4 + 1, vocab // 4 + 2])
    block_b = torch.tensor([vocab // 2, vocab // 2 + 1, vocab // 2 + 2])
    ids = torch.empty(n, T, dtype=torch.long)
    for u in range(T // 4):
        ids[:, 4 * u] = torch.randint(10, 40, (n,), generator=g)
        pick_a = torch.rand(n, generator=g) < 0.5
        ids[:, 4 * u + 1:4 * u + 4] = torch.where(pick_a[:, None], block_a, block_b)
    return ids


@torch.no_grad()
def evaluate(model, ids, mask, anchors):
    model.eval()
    out = model(ids, mask, anchors=anchors)
    model.train()
    return {k: float(v) for k, v in out.terms.items()}, out.metrics


@pytest.mark.slow
def test_joint_training_lowers_losses_and_head_beats_drafter_on_ambiguous_blocks():
    # A 512-token vocabulary keeps 300 steps inside the test budget (the LM head dominates on CPU).
    cfg = load_config("tiny-random", ["target.vocab_size=512", "drafter.anchors_per_seq=8", "optim.lr_drafter=3e-3", "optim.lr_head=3e-3",
                       "train.labels=corpus",  # the corpus is the point here, not a random target's argmax
                       # With the default raw target embeddings (std ~0.02) the pairing often stays at its symmetric
                       # saddle for 300 steps: head = drafter = 0.50 on seeds 0-2, 0.83 on seed 3, depending on
                       # float order (the host). RMS-normalised embeddings leave it on every seed 0-4 tried
                       # (head 0.83-0.89, drafter 0.49-0.64): the test is about the head's reach, not this choice.
                       "head.lilicorr_embed=rms"])
    assert cfg.drafter.block_size == 4 and cfg.head.top_k >= 2
    torch.manual_seed(0)
    model = JointModel(cfg, build_random_target(cfg.target))
    g = torch.Generator().manual_seed(0)
    T = 32
    corpus = two_block_corpus(64, T, cfg.target.vocab_size, g)
    mask = torch.ones_like(corpus, dtype=torch.bool)
    held_out = two_block_corpus(32, T, cfg.target.vocab_size, torch.Generator().manual_seed(1))
    held_mask = torch.ones_like(held_out, dtype=torch.bool)
    all_anchors = torch.arange(1, T - 2).expand(32, -1)  # every position: deterministic and ambiguous blocks
    p_anchors = torch.arange(4, T - 3, 4).expand(32, -1)  # anchors at P: the ambiguous case

    opt = torch.optim.AdamW(model.param_groups(cfg.optim), betas=cfg.optim.betas)
    start, early = time.perf_counter(), None
    for step in range(STEPS):
        if step == 30:  # LiLiCorr's terms live on the oracle prefix, empty until the drafter covers it
            early, _ = evaluate(model, held_out, held_mask, all_anchors)
        idx = torch.randint(0, corpus.shape[0], (4,), generator=g)
        out = model(corpus[idx], mask[idx], generator=g, progress=step / STEPS, with_metrics=False)
        opt.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        opt.step()
    late, _ = evaluate(model, held_out, held_mask, all_anchors)
    _, amb = evaluate(model, held_out, held_mask, p_anchors)
    print(f"{STEPS} steps in {time.perf_counter() - start:.1f}s; terms at step 30 {early}, at {STEPS} {late}; "
          f"ambiguous blocks: {amb}")
    for k in TERMS:
        assert late[k] < early[k], (k, early[k], late[k])
    # Teacher-forced top-1 on the oracle prefix: slot 1 is a coin flip for both; slots 2-3 are
    # determined by slot 1, which the head sees and the drafter's marginals cannot.
    assert amb["oracle_prefix_coverage"] > 0.6  # 0.65-1.0 on seeds 0-4: the head's figure is over enough blocks
    # Expected: drafter ~ 0.5 (it commits to one block everywhere), head ~ (0.5 + 1 + 1) / 3.
    assert amb["drafter_top1_oracle"] < 0.7
    assert amb["head_top1_oracle"] > amb["drafter_top1_oracle"] + 0.15
