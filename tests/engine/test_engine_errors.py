"""Bad input fails with a message naming it, and never takes the rest of the batch down."""

import json
from pathlib import Path

import pytest

from lilicorr.engine.requests import Request
from lilicorr.engine.systems import UnknownSystemOrCheckpoint, build_decoder
from engine_helpers import tiny_config, varied_random_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model():
    cfg = tiny_config("llama", overrides=["engine.max_seq_len=40"])
    return cfg, varied_random_target(cfg, seed=2)


def test_bad_requests_fail_alone(model):
    cfg, m = model
    good = [[5, 6, 7], [9, 10]]
    dec = build_decoder(cfg, m, "dflash", max_batch=2)
    res = dec.generate([Request("ok-0", good[0], max_new_tokens=8), Request("empty", []),
                        Request("long", list(range(45))), Request("ok-1", good[1], max_new_tokens=8),
                        Request("oov", [1, 10 ** 6]), Request("neg-t", [1, 2], temperature=-1.0)])
    errors = {r.id: r.error for r in res if r.error}
    assert set(errors) == {"empty", "long", "oov", "neg-t"}
    assert "'empty'" in errors["empty"] and "empty prompt" in errors["empty"]
    assert "45 tokens" in errors["long"] and "max_seq_len=40" in errors["long"]
    assert "1000000" in errors["oov"]
    alone = build_decoder(cfg, m, "ar", max_batch=1).generate([Request(0, g, max_new_tokens=8) for g in good])
    assert [res[0].output_ids, res[3].output_ids] == [r.output_ids for r in alone]
    assert all(len(r.output_ids) == 8 for r in alone)


def test_prompt_plus_budget_is_clipped_to_the_cache(model):
    cfg, m = model
    res = build_decoder(cfg, m, "dflash", max_batch=1).generate([Request(0, list(range(1, 36)), max_new_tokens=50)])
    assert res[0].error is None and len(res[0].output_ids) == 40 - 35


def test_unknown_system_is_named(model):
    cfg, m = model
    with pytest.raises(UnknownSystemOrCheckpoint, match="'medusa'.*known systems: ar, dflash"):
        build_decoder(cfg, m, "medusa")


def test_checkpoint_of_wrong_shape_or_head_is_named(model, tmp_path):
    from lilicorr.models.joint import JointModel

    cfg, m = model
    other_cfg = tiny_config("llama", overrides=["target.hidden_size=32", "target.head_dim=8", "head.kind=none"])
    JointModel(other_cfg, varied_random_target(other_cfg)).export(tmp_path / "small")
    with pytest.raises(UnknownSystemOrCheckpoint, match="small.*does not fit the target"):
        build_decoder(cfg, m, "dflash", checkpoint=str(tmp_path / "small"))
    with pytest.raises(UnknownSystemOrCheckpoint, match="holds head 'none', system 'lilicorr' needs 'lilicorr'"):
        build_decoder(cfg, m, "lilicorr", checkpoint=str(tmp_path / "small"))
    with pytest.raises(UnknownSystemOrCheckpoint, match="no config.json"):
        build_decoder(cfg, m, "dflash", checkpoint=str(tmp_path))


def test_generate_cli_rows_summary_and_errors(tmp_path, capsys, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("jobs_generate", ROOT / "jobs" / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join([json.dumps({"id": "a", "prompt": "Hello there"}),
                                  json.dumps({"id": "b", "messages": [{"role": "user", "content": "Hi"}]}),
                                  json.dumps({"id": "c", "prompt": ""}), "{broken", ""]))
    out = tmp_path / "o.jsonl"
    summary = generate.main(["--preset", "tiny-random", "--system", "dflash", "--drafter", "random", "--prompts",
                             str(prompts), "--out", str(out), "--max-new-tokens", "5", "--batch-size", "2",
                             "engine.max_seq_len=128"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == json.loads(json.dumps(summary))
    assert summary["system"] == "dflash" and summary["blocks"] > 0 and summary["tau"] >= 1.0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a", "b", "c", "line-4"]
    assert len(rows[0]["output_ids"]) == 5 and isinstance(rows[0]["text"], str) and "error" not in rows[0]
    assert "empty prompt" in rows[2]["error"] and "not JSON" in rows[3]["error"]
    for argv, message in [(["--system", "medusa"], "unknown system 'medusa'"),
                          (["--system", "lilicorr"], "needs --checkpoint DIR or --drafter random")]:
        with pytest.raises(SystemExit) as e:
            generate.main(["--preset", "tiny-random", *argv, "--prompts", str(prompts), "--out", str(out)])
        assert e.value.code == 2 and message in capsys.readouterr().err


def test_drafter_context_and_target_cache_lengths_must_agree(model):
    """The draft runner is the only writer of the drafter's context; a write where its length and the target
    cache's differ (a bookkeeping bug) fails loudly instead of drafting from a misaligned context."""
    cfg, m = model
    dec = build_decoder(cfg, m, "dflash", max_batch=1)
    assert dec.generate([Request("a", [5, 6, 7], max_new_tokens=6)])[0].error is None
    runner = dec.runner
    runner.open_slot(0, _greedy(), 3, 6)
    assert int(runner.drafting.ctx_cache.lens[0]) == 0  # opening a slot empties both
    runner.prefill([0], [[5, 6, 7]], [0], [True])
    assert int(runner.drafting.ctx_cache.lens[0]) == int(runner.cache.lens[0]) == 3
    runner.run_block(slice(0, 1), longest=3)
    assert int(runner.drafting.ctx_cache.lens[0]) == int(runner.cache.lens[0])
    runner.drafting.ctx_cache.lens[0] += 1
    with pytest.raises(RuntimeError, match="lengths differ"):
        runner.run_block(slice(0, 1), longest=int(runner.cache.lens[0]))


def _greedy():
    from lilicorr.engine.runner import SlotSampling

    return SlotSampling(temperature=0.0, top_k=0, top_p=1.0, generator=None)
