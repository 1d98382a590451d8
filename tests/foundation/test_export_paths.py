"""Exports keep no machine paths: config.json records provenance relative to the repo, never /home/..."""

import json
from pathlib import Path

from lilicorr.config import load_config
from lilicorr.config.paths import REPO_ROOT
from lilicorr.models.export_paths import ELSEWHERE, machine_paths, portable_paths

ROOT = Path(__file__).resolve().parents[2]


def test_paths_under_the_repo_become_relative_and_others_keep_their_name(tmp_path):
    d = {"data": {"output_dir": str(REPO_ROOT / "outputs" / "demo" / "regenerated"), "source": "embedded:sharegpt"},
         "train": {"init_from": str(tmp_path / "base" / "export"), "output_dir": "outputs/train"},
         "tracking": {"tracking_uri": f"sqlite:///{tmp_path}/mlruns.db"},
         "remote": ["s3://bucket/dir", "models:/x@newest", "http://127.0.0.1:5000", None, 3]}
    out = portable_paths(d, roots=[REPO_ROOT])
    assert out["data"] == {"output_dir": "outputs/demo/regenerated", "source": "embedded:sharegpt"}
    assert out["train"] == {"init_from": f"{ELSEWHERE}/export", "output_dir": "outputs/train"}
    assert out["tracking"]["tracking_uri"] == f"sqlite:///{ELSEWHERE}/mlruns.db"
    assert out["remote"] == d["remote"]
    assert machine_paths(d) == [f"data.output_dir={d['data']['output_dir']}", f"train.init_from={d['train']['init_from']}",
                                f"tracking.tracking_uri={d['tracking']['tracking_uri']}"]
    assert machine_paths(out) == []


def test_an_export_written_here_names_no_folder_of_this_machine(tmp_path):
    import torch

    from lilicorr.models.joint import JointModel
    from lilicorr.models.target import build_random_target

    cfg = load_config("tiny-random", [f"data.output_dir={REPO_ROOT / 'outputs' / 'corpus'}",
                                      f"train.output_dir={tmp_path / 'run'}"])
    cfg.train.init_from = str(tmp_path / "base")  # provenance only: load_config would refuse it (no export there)
    torch.manual_seed(0)
    folder = JointModel(cfg, build_random_target(cfg.target)).export(tmp_path / "export")
    meta = json.loads((folder / "config.json").read_text())
    assert machine_paths(meta) == []
    assert str(tmp_path) not in json.dumps(meta) and str(REPO_ROOT) not in json.dumps(meta)
    assert meta["config"]["data"]["output_dir"] == "outputs/corpus"
    assert meta["config"]["train"]["output_dir"] == f"{ELSEWHERE}/run"


def test_shipped_checkpoints_carry_no_machine_paths():
    configs = sorted((ROOT / "checkpoints").glob("*/*/config.json"))
    assert configs, "no shipped checkpoints found under checkpoints/"
    found = {str(p.relative_to(ROOT)): machine_paths(json.loads(p.read_text())) for p in configs}
    assert {k: v for k, v in found.items() if v} == {}
