"""Sweep pieces without Ray: the search space checked like overrides, --config FILE round trips, grouping over
seeds (hand-computed mean ± sample std), the spread verdicts and the ablation arms (equal reranker weight)."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lilicorr.cli import parse_job_args
from lilicorr.config import ConfigError, load_config
from lilicorr.config.overrides import read_config_file, write_config_file
from lilicorr.platform.sweep.ablations import ablation_arms, check_ablation, difference_note
from lilicorr.platform.sweep.report import spread_note
from lilicorr.platform.sweep.results import TrialRecord, group_over_seeds, groups_table
from lilicorr.platform.sweep.runner import stage_two_configs
from lilicorr.platform.sweep.space import apply_overrides, parse_space, sweep_name

REPO = Path(__file__).resolve().parents[2]


def _cfg(*overrides):
    return load_config("tiny-random", list(overrides))


def test_space_parsed_and_every_value_checked():
    cfg = _cfg("sweep.space=loss.gamma=0.1|0.5,loss.lam=loguniform:0.1:10,train.max_steps=randint:2:6")
    dims = parse_space(cfg)
    assert [(d.key, d.values, d.dist) for d in dims] == [
        ("loss.gamma", ("0.1", "0.5"), None), ("loss.lam", (), "loguniform"), ("train.max_steps", (), "randint")]
    assert (dims[1].low, dims[1].high) == (0.1, 10.0)

    bad = {
        "sweep.space=loss.gama=0.1|0.2": "unknown config key 'loss.gama'",
        "sweep.space=loss.gamma=0.1|abc": "bad value 'abc' for loss.gamma",
        "sweep.space=head.kind=lilicorr|lilicor": "lilicor",
        "sweep.space=loss.gamma=0.1|": "empty value",
        "sweep.space=loss.gamma=uniform:1:0": "low < high",
        "sweep.space=sweep.num_samples=1|2": "cannot be swept",
        "sweep.search=bayes": "sweep.search",
        "sweep.scheduler=pbt": "sweep.scheduler",
        "sweep.metric=train_loss": "never a training loss",
        "sweep.num_samples=0": "num_samples",
    }
    for override, message in bad.items():
        with pytest.raises(ConfigError, match=message):
            parse_space(_cfg(override))
    with pytest.raises(ConfigError, match="needs sweep.search=random"):
        parse_space(_cfg("sweep.search=grid", "sweep.space=loss.lam=uniform:0:1"))


def test_bad_space_fails_fast_from_the_job():
    start = time.perf_counter()
    out = subprocess.run([sys.executable, str(REPO / "jobs/sweep.py"), "--preset", "tiny-random",
                          "sweep.space=loss.gama=0.1|0.2"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "unknown config key 'loss.gama'" in out.stderr
    assert "ray" not in out.stderr.lower()  # refused before Ray started
    assert time.perf_counter() - start < 30


def test_overrides_and_name():
    cfg = _cfg("loss.mu=0.5")
    out = apply_overrides(cfg, {"loss.gamma": "0.7", "train.seed": 3})
    assert (out.loss.gamma, out.loss.mu, out.train.seed, cfg.loss.gamma) == (0.7, 0.5, 3, 0.25)
    assert sweep_name(cfg) == sweep_name(_cfg("loss.mu=0.5", "sweep.output_dir=/elsewhere"))  # same sweep resumes
    assert sweep_name(cfg) != sweep_name(_cfg("loss.mu=0.5", "sweep.num_samples=3"))
    assert sweep_name(_cfg("sweep.name=mine")) == "mine"


def test_config_file_round_trip(tmp_path):
    cfg = _cfg("loss.gamma=0.6", "train.max_steps=7", "sweep.seeds=[4,5]", "target.eos_token_ids=[1,2]")
    path = write_config_file(cfg, tmp_path / "best.yaml", header="a header")
    _, back = parse_job_args("x", argv=["--preset", "smollm2-135m", "--config", str(path)])
    assert back.to_dict() | {"preset": cfg.preset} == cfg.to_dict()  # every field, whatever the preset
    args, later = parse_job_args("x", argv=["--preset", "tiny-random", "--config", str(path), "loss.gamma=0.9"])
    assert (later.loss.gamma, later.train.max_steps) == (0.9, 7)  # the command line wins over the file
    # jobs that rebuild their config from args.overrides (demo, train_shipped) see the file's settings, first
    assert "train.max_steps=7" in args.overrides and args.overrides[-1] == "loss.gamma=0.9"

    (tmp_path / "c.json").write_text('{"preset": "x", "head": {"top_k": 2}, "loss.lam": 0}')
    assert read_config_file(tmp_path / "c.json") == ["head.top_k=2", "loss.lam=0"]
    (tmp_path / "bad.yaml").write_text("loss.gamma: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid yaml"):
        read_config_file(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="does not exist"):
        read_config_file(tmp_path / "missing.yaml")


def _rec(tid, tau, seed, gamma="0.1", status="completed", stage="s1", arm=""):
    return TrialRecord(tid, stage, {"loss.gamma": gamma, "train.seed": str(seed)}, tau, step=4, status=status,
                       run_id=f"run-{tid}", arm=arm)


def test_grouped_over_seeds_mean_and_sample_std():
    records = [_rec("a", 1.5, 0), _rec("b", 1.7, 1, stage="s2"), _rec("c", 1.9, 2, stage="s2"),
               _rec("d", 1.2, 0, gamma="0.5"), _rec("e", 3.0, 0, gamma="0.9", status="stopped")]
    groups = group_over_seeds(records)
    assert [g.key for g in groups] == ["loss.gamma=0.1", "loss.gamma=0.5"]  # stopped trials are not grouped
    assert groups[0].mean == pytest.approx(1.7)
    assert groups[0].std == pytest.approx(0.2)  # sqrt(((-.2)^2 + 0 + .2^2) / (3 - 1))
    assert math.isnan(groups[1].std)
    assert "1.7000 ± 0.2000 | 3 | 0,1,2" in groups_table(groups, "tau")
    # Stage two picks the best completed distinct configs (the stopped 3.0 does not count).
    assert stage_two_configs(records[:1] + records[3:], 2) == [{"loss.gamma": "0.1", "train.seed": "0"},
                                                                {"loss.gamma": "0.5", "train.seed": "0"}]


def test_spread_verdicts():
    seeds = [_rec("a", 1.5, 0), _rec("b", 1.7, 1, stage="s2"), _rec("c", 1.9, 2, stage="s2")]
    close = seeds + [_rec("d", 1.6, 0, gamma="0.5")]  # configs 0.1 apart, seed std 0.2
    text, stats = spread_note(close, group_over_seeds(close))
    assert stats == pytest.approx({"config_range": 0.1, "seed_std": 0.2}) and "NOT measurable" in text
    far = seeds + [_rec("d", 0.5, 0, gamma="0.5")]  # 1.0 apart > 2 x 0.2
    assert "are measurable" in spread_note(far, group_over_seeds(far))[0]
    assert "unknown" in spread_note(seeds[:1], group_over_seeds(seeds[:1]))[0]
    # An ablation: two arms over the same three seeds, no stage one; arm means 1.7 and 1.6, seed std 0.2.
    arms = [_rec(str(i), t, i % 3, stage="ab", gamma=g)
            for i, (t, g) in enumerate([(1.5, "0.1"), (1.7, "0.1"), (1.9, "0.1"), (1.4, "0"), (1.6, "0"), (1.8, "0")])]
    text, stats = spread_note(arms, group_over_seeds(arms))
    assert stats == pytest.approx({"config_range": 0.1, "seed_std": 0.2}) and "NOT measurable" in text
    assert "mean τ over seeds" in text


def test_ablation_arms_keep_total_reranker_weight():
    cfg = _cfg("loss.gamma=0.25", "loss.lam=1.0", "loss.mu=0.5")
    arms = ablation_arms(cfg, "distractor")
    full, ablated = (apply_overrides(cfg, a).loss for a in arms.values())
    # reranker weight of L = dflash + γ[(1-μ)CE + λ dist + μ margin] is γ(1 + λ)
    weight = lambda l: l.gamma * ((1 - l.mu) + l.lam + l.mu)  # noqa: E731
    assert (ablated.gamma, ablated.lam) == (0.5, 0.0)
    assert weight(full) == weight(ablated) == 0.5
    margin = [apply_overrides(cfg, a).loss for a in ablation_arms(cfg, "margin").values()]
    assert [(m.mu, m.rho) for m in margin] == [(0.0, 2.0), (0.5, 2.0)]
    with pytest.raises(ConfigError, match="loss.lam > 0"):
        ablation_arms(_cfg("loss.lam=0"), "distractor")
    with pytest.raises(ConfigError, match="head.kind"):
        check_ablation(_cfg("head.kind=none"), "margin", None)
    with pytest.raises(ConfigError, match="--export"):
        check_ablation(_cfg(), "decode-rule", "/nonexistent")


def test_difference_note():
    a = [_rec(f"a{s}", t, s, arm="full") for s, t in enumerate([2.0, 2.1, 2.2])]
    b = [_rec(f"b{s}", t, s, arm="no-distractor") for s, t in enumerate([1.0, 1.1, 1.2])]
    note = difference_note(group_over_seeds(a + b), "full", "no-distractor", "tau")
    assert "-1.0000" in note and "standard error 0.0816" in note and ": measurable" in note  # sqrt(2 x .01/3)
    b2 = [_rec(f"b{s}", t, s, arm="no-distractor") for s, t in enumerate([2.0, 2.2, 2.3])]
    assert "NOT measurable" in difference_note(group_over_seeds(a + b2), "full", "no-distractor", "tau")
