"""lilicorr/bench/harness.py: the steps every benchmark shares (its timing, prompts, engine sizing, stop cut and the
JSON line it prints last)."""

import json

import torch

from lilicorr.bench import harness
from lilicorr.config import load_config


def test_median_s_warms_up_once_then_takes_the_median(monkeypatch):
    calls = []
    ticks = iter([0.0, 3.0, 10.0, 11.0, 20.0, 22.0])  # the timed calls' clock readings: 3, 1 and 2 s
    monkeypatch.setattr(harness.time, "perf_counter", lambda: next(ticks))  # a fake clock: no busy CPU can skew it
    assert harness.median_s(lambda: calls.append(1), 3) == 2.0
    assert len(calls) == 4  # the untimed warm-up call, then three timed ones


def test_cut_at_stop_keeps_the_stop_token():
    assert harness.cut_at_stop([4, 5, 2, 7, 2], {2}) == [4, 5, 2]
    assert harness.cut_at_stop([4, 5], {2}) == [4, 5]


def test_bench_prompts_without_a_tokenizer_are_seeded_random_prompts():
    a, b = harness.bench_prompts(None, 3, 100), harness.bench_prompts(None, 3, 100)
    assert a == b and [len(p) for p in a] == [40, 47, 54] and max(max(p) for p in a) < 100


def test_size_engine_fits_the_longest_prompt_its_tokens_and_the_slack():
    cfg = load_config("tiny-random", [])
    harness.size_engine(cfg, [[1] * 5, [1] * 9], 20, slack=16)
    assert (cfg.engine.max_new_tokens, cfg.engine.max_seq_len) == (20, 9 + 20 + 16)


def test_json_line_is_the_last_stdout_line(capsys):
    res = harness.json_line({"bench": "x", "tok_s": 1.5})
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line == res and list(line)[-1] == "load_average" and len(line["load_average"]) == 3
    assert "load_average" not in harness.json_line({"bench": "y"}, load_average=False)


def test_sync_is_a_no_op_on_the_cpu():
    harness.sync(torch.device("cpu"))
    harness.sync("cpu")
