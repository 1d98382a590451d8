"""The target feature cache (issue 11): built once by a Ray Data stage, read back bit-exact in fp32, and
training from it gives the same losses as training with the live target pass."""

from __future__ import annotations

import json

import pytest
import torch

from lilicorr.config import load_config
from lilicorr.platform.train.shards import synthetic_rows, write_shards


def _cfg(tmp_path, *extra):
    return load_config("tiny-random", [f"data.output_dir={tmp_path / 'data'}", "train.feature_dtype=float32",
                                       "train.seq_len=48", *extra])


def _write(cfg, n=6):
    rows = synthetic_rows(n, cfg.target.vocab_size, 20, 60, seed=3)
    write_shards(rows[: n - 2], cfg.data.output_dir, "train", 2)
    write_shards(rows[n - 2:], cfg.data.output_dir, "heldout", 2)
    return rows


def test_cached_features_give_the_same_losses_as_the_live_target(tmp_path):
    from lilicorr.models.joint import JointModel
    from lilicorr.platform.assets import load_target
    from lilicorr.platform.train.data import pad_rows
    from lilicorr.platform.train.features import FeatureSpec, TargetFeaturizer

    for head in ("none", "lilicorr"):
        cfg = _cfg(tmp_path, f"head.kind={head}", "train.distill=0.5")
        rows = _write(cfg)[:3]
        feat = TargetFeaturizer(cfg.to_dict())  # the Ray Data stage's function, called directly
        out = feat({k: [r[k] for r in rows] for k in ("id", "input_ids", "loss_mask")})
        H = cfg.target.hidden_size
        spec = FeatureSpec("float32", len(feat.adapter.capture_ids) * H, H)
        ids, mask = pad_rows([r["input_ids"] for r in rows], [r["loss_mask"] for r in rows], cfg.train.seq_len, False)
        tp = spec.batch(out, ids.shape[1])
        torch.manual_seed(0)
        hf, _ = load_target(cfg.target)
        joint = JointModel(cfg, hf)
        live = joint(ids, mask, generator=torch.Generator().manual_seed(5))
        cached = joint(ids, mask, generator=torch.Generator().manual_seed(5), features=tp)
        assert abs(float(live.loss) - float(cached.loss)) < 1e-5, head
        for k in live.terms:
            assert abs(float(live.terms[k]) - float(cached.terms[k])) < 1e-5, (head, k)
        assert live.metrics["sim_acceptance_length"] == cached.metrics["sim_acceptance_length"]


@pytest.mark.slow
def test_ray_data_stage_builds_the_cache_once_and_reuses_it(tmp_path, local_ray_2cpu):
    from lilicorr.platform.train.features import FeatureSpec, build_feature_cache, live_channel_rms, read_manifest
    from lilicorr.platform.train.data import split_files
    import pyarrow.parquet as pq

    cfg = _cfg(tmp_path)
    _write(cfg)
    logs = []
    d = build_feature_cache(cfg, log=logs.append)
    meta = read_manifest(d)
    assert meta["rows"] == {"train": 4, "heldout": 2} and len(meta["channel_rms"]) == meta["hidden_size"] * len(meta["capture_ids"])
    assert build_feature_cache(cfg, log=logs.append) == d and "reusing" in logs[-1]
    # train.feature_cache=false measures the same statistics on the live target (drafter.feature_scaling)
    from lilicorr.platform.assets import load_target

    assert live_channel_rms(cfg, load_target(cfg.target)[0]) == pytest.approx(meta["channel_rms"], rel=1e-5)
    other = _cfg(tmp_path, "drafter.num_captured=1")  # a different capture set is another cache
    assert build_feature_cache(other, log=logs.append) != d
    spec = FeatureSpec.from_manifest(meta)
    rows = [r for f in split_files(d, "train") for r in pq.read_table(f).to_pylist()]
    assert len(rows) == 4
    tp = spec.row(rows[0], 10_000)
    assert tp.captured.shape == (1, len(rows[0]["input_ids"]), spec.width)
    assert json.loads((tmp_path / "data" / d.split("/")[-1] / "manifest.json").read_text())["dtype"] == "float32"
