"""engine.build_joint sets a run's model up in one place: init_from, then the feature scale (keeping what
an export's drafter computes), then the data's draft vocabulary unless the export brought its own."""

from __future__ import annotations

import pytest
import torch

from lilicorr.config import load_config
from lilicorr.platform.train.engine import build_joint
from lilicorr.platform.train.shards import synthetic_rows
from lilicorr.platform.train.data import pad_rows

BASE = ["head.kind=none", "drafter.feature_scaling=true", "train.feature_cache=true", "drafter.draft_vocab=96"]


def _loss(joint, ids, mask, anchors) -> float:
    joint.eval()
    with torch.no_grad():
        return float(joint(ids, mask, anchors=anchors).loss)


def test_init_from_an_export_keeps_its_function_scale_and_vocabulary(tmp_path):
    cfg = load_config("tiny-random", BASE)
    width = 2 * cfg.target.hidden_size  # captured layers (one per drafter layer) x hidden
    rms = torch.linspace(0.5, 30.0, width)
    meta = {"channel_rms": rms.tolist()}
    first_vocab = list(range(100, 196))
    trained = build_joint(cfg, torch.device("cpu"), feature_meta=meta, draft_vocab=first_vocab)
    assert torch.allclose(trained.drafter.feature_scale, 1.0 / rms)
    assert trained.drafter.draft_ids.tolist() == first_vocab and trained.drafter.vocab_source == "data"
    with torch.no_grad():  # stands for training: weights unlike the seeded init
        trained.drafter.fc.weight.normal_(0.0, 0.05)
    rows = synthetic_rows(2, 49152, 30, 30, seed=0)
    ids, mask = pad_rows([r["input_ids"] for r in rows], [r["loss_mask"] for r in rows], 64, False)
    ids, mask = ids[:, :30], torch.ones(2, 30, dtype=torch.bool)
    anchors = torch.tensor([[2, 9, 17], [4, 11, 20]])
    want = _loss(trained, ids, mask, anchors)
    trained.export(tmp_path / "export")  # folds the scale into fc

    cont_cfg = load_config("tiny-random", BASE + [f"train.init_from={tmp_path / 'export'}"])
    cont = build_joint(cont_cfg, torch.device("cpu"), feature_meta=meta, draft_vocab=list(range(300, 396)))
    assert cont.drafter.draft_ids.tolist() == first_vocab  # the export's vocabulary, not this data's
    assert cont.drafter.vocab_source == "export"
    assert torch.allclose(cont.drafter.feature_scale, 1.0 / rms)
    # Same function as the exported drafter: fc was divided by the scale it multiplies the inputs by
    # (scaled twice, the loss would differ).
    assert _loss(cont, ids, mask, anchors) == pytest.approx(want, rel=1e-5)


def test_feature_scaling_without_statistics_names_the_field(tmp_path):
    cfg = load_config("tiny-random", BASE + [f"data.output_dir={tmp_path}"])  # no cache statistics, no rows to measure
    with pytest.raises(ValueError, match=r"no training rows"):
        build_joint(cfg, torch.device("cpu"), feature_meta=None)
