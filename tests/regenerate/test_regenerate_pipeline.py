"""The Ray Data regeneration pipeline end to end on tiny-random: the target's own greedy answers, counted
skips, and a run killed after its first shard that resumes to exactly the rows of an uninterrupted run."""

import json

import pytest

from lilicorr.config import load_config
from lilicorr.platform import assets
from lilicorr.platform.regenerate.pipeline import run_regeneration
from lilicorr.platform.chat import prompt_ids
from lilicorr.platform.regenerate.generate import GreedyGenerator, hf_greedy
from lilicorr.platform.regenerate.shards import read_split

pytestmark = pytest.mark.slow

# Untied embeddings: a tied random target mostly echoes its last input token ("\n\n\n..."), which
# would make "equals the target's greedy output" a weak check.
TARGET = ["target.tie_word_embeddings=false", "target.seed=1"]


def U(t):
    return {"role": "user", "content": t}


def A(t):
    return {"role": "assistant", "content": t}


ROWS = [
    {"id": "s1_0", "conversations": [{"from": "human", "value": "Tell me about cats"}, {"from": "gpt", "value": "x"},
                                     {"from": "human", "value": "And dogs?"}, {"from": "gpt", "value": "y"}]},
    {"id": "o2", "messages": [{"role": "system", "content": "Answer briefly."}, U("What is 2+2?"), A("4")]},
    "not json",  # malformed
    {"id": "e4", "messages": [U("   "), A("x")]},  # empty_turn
    {"id": "o5", "messages": [U("Name a river"), A("Nile"), U("Longer?"), A("Amazon"), U("Which sea?"), A("x")]},
    {"id": "b6", "messages": [U("a"), U("b"), A("x")]},  # bad_role_order
    {"id": "o7", "messages": [A("orphan"), U("Translate 'cat' to French"), A("chat")]},
    {"id": "m8", "messages": [{"role": "robot", "content": "beep"}]},  # malformed (unknown role)
    {"id": "n9", "messages": [U("question with no answer")]},  # no_assistant_turn
    {"id": "o10", "messages": [U("Write a haiku"), A("...")]},
]
SKIPS = {"bad_role_order": 1, "empty_turn": 1, "malformed": 2, "no_assistant_turn": 1}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("regen") / "chats.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in ROWS))
    return path


def _cfg(source, out, **extra):
    overrides = {"data.source": str(source), "data.output_dir": str(out), "data.rows_per_shard": 4,
                 "data.batch_size": 4, "data.max_new_tokens": 12, "data.heldout_fraction": 0.3, **extra}
    return load_config("tiny-random", TARGET + [f"{k}={v}" for k, v in overrides.items()])


@pytest.fixture(scope="module")
def clean_run(local_ray_2cpu, source, tmp_path_factory):
    out = tmp_path_factory.mktemp("clean")
    return out, run_regeneration(_cfg(source, out))


def _rows(out):
    rows = []
    for split in ("train", "heldout"):
        rows += [{**r, "split": split} for r in read_split(str(out), split).to_pylist()]
    return sorted(rows, key=lambda r: r["row_index"])


def test_every_assistant_turn_is_the_targets_own_greedy_continuation(clean_run, source):
    out, _ = clean_run
    cfg = _cfg(source, out)
    model, tok = assets.load_target(cfg.target)
    stop = assets.eos_token_ids(cfg.target, tok)
    rows = _rows(out)
    assert [r["id"] for r in rows] == ["s1_0", "o2", "o5", "o7", "o10"]
    turns_checked = 0
    for r in rows:
        msgs = r["messages"]
        for k, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            prompt = prompt_ids(tok, msgs[:k], enable_thinking=False)
            ref = hf_greedy(model, tok, prompt, cfg.data.max_new_tokens, stop)  # transformers generate
            text = tok.decode(ref[:-1] if ref and ref[-1] in stop else ref, skip_special_tokens=False)
            assert m["content"] == text, (r["id"], k)
            turns_checked += 1
        # The last turn is stored as the exact ids: prompt + generated, 1s on the generated part only.
        assert r["input_ids"][:len(prompt)] == prompt and r["input_ids"][len(prompt):] == ref
        assert r["loss_mask"][len(prompt):] == [1] * len(ref)
        # Inside the prompt, the mask picks out exactly the earlier answers' text (none stopped by itself
        # here, so no end-of-turn token is theirs).
        earlier = [t for t, bit in zip(r["input_ids"][:len(prompt)], r["loss_mask"][:len(prompt)]) if bit]
        assert tok.decode(earlier, skip_special_tokens=False) == "".join(
            m["content"] for m in msgs[:-1] if m["role"] == "assistant")
    assert turns_checked == sum(r["num_assistant_turns"] for r in rows) == 2 + 1 + 3 + 1 + 1
    # Source assistant texts are gone; system and user texts are kept verbatim.
    o5 = next(r for r in rows if r["id"] == "o5")
    assert [m["content"] for m in o5["messages"] if m["role"] == "user"] == ["Name a river", "Longer?", "Which sea?"]
    assert "Nile" not in json.dumps(o5["messages"])
    assert next(r for r in rows if r["id"] == "o2")["messages"][0] == {"role": "system", "content": "Answer briefly."}


def test_bad_rows_are_counted_by_reason_and_the_summary_adds_up(clean_run):
    out, result = clean_run
    c = result["corpus"]
    assert c["rows_in"] == len(ROWS) and c["skipped"] == SKIPS
    assert c["rows_out"]["train"] + c["rows_out"]["heldout"] == len(ROWS) - sum(SKIPS.values()) == 5
    assert c["assistant_turns"] == 8 and c["turns_capped"] == sum(r["turns_capped"] for r in _rows(out))
    assert c["generated_tokens"] == sum(r["generated_tokens"] for r in _rows(out)) > 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(manifest["shards"]) == ["0", "1", "2"] and manifest["num_rows"] == len(ROWS)
    assert manifest["source"].endswith("chats.jsonl") and manifest["target"] == "random"
    assert result["this_run"]["tokens_per_second"] > 0 and result["samples"]


def test_killed_run_resumes_to_the_same_rows(clean_run, source, tmp_path):
    clean_out, _ = clean_run
    cfg = _cfg(source, tmp_path)

    def crash_after_first(shard, counts):
        raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError, match="simulated crash"):
        run_regeneration(cfg, on_shard_done=crash_after_first)
    done = json.loads((tmp_path / "manifest.json").read_text())["shards"]
    assert sorted(done) == ["0"]
    # Debris a kill can leave: a half-written temp file, and a shard file written but not yet recorded.
    (tmp_path / "train" / "shard-00001.parquet.tmp-dead").write_bytes(b"partial")
    (tmp_path / "train" / "shard-00001.parquet").write_bytes(b"garbage, rewritten on resume")

    resumed = run_regeneration(cfg)
    assert resumed["this_run"]["shards"] == 2 and resumed["corpus"]["shards"] == 3
    assert not list(tmp_path.rglob("*.tmp-*"))
    got, want = _rows(tmp_path), _rows(clean_out)
    assert [r["row_index"] for r in got] == sorted({r["row_index"] for r in got})  # no duplicates
    assert got == want  # nothing lost, nothing changed

    again = run_regeneration(cfg)  # idempotent: nothing left to do
    assert again["this_run"]["shards"] == 0 and _rows(tmp_path) == want


def test_the_local_runner_makes_the_ray_pipelines_rows_and_resumes_a_killed_run(clean_run, source, tmp_path):
    """data.runner=local (one process, no Ray: a single GPU machine) writes the same shards as the Ray pipeline."""
    clean_out, clean = clean_run
    cfg = _cfg(source, tmp_path, **{"data.runner": "local"})

    def crash_after_first(shard, counts):
        raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError, match="simulated crash"):
        run_regeneration(cfg, on_shard_done=crash_after_first)
    resumed = run_regeneration(cfg)
    assert resumed["this_run"]["shards"] == 2 and resumed["corpus"]["generated_tokens"] == clean["corpus"]["generated_tokens"]
    assert _rows(tmp_path) == _rows(clean_out)


def test_start_row_and_max_turns_make_the_later_shards_first_turns(clean_run, source, tmp_path):
    """data.start_row skips the shards before it (their numbers stay those of a run from row 0), and data.max_turns=1
    regenerates each conversation's first answer only: the clean run's rows cut after their first answer."""
    clean_out, _ = clean_run
    run_regeneration(_cfg(source, tmp_path, **{"data.runner": "local", "data.start_row": 4, "data.max_turns": 1}))
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert sorted(manifest["shards"]) == ["1", "2"] and manifest["fingerprint"]["max_turns"] == 1
    clean = {r["id"]: r for r in _rows(clean_out) if r["row_index"] >= 4}
    got = _rows(tmp_path)
    assert [r["id"] for r in got] == ["o5", "o7", "o10"]
    for r in got:
        c = clean[r["id"]]
        assert r["num_assistant_turns"] == 1 and r["messages"][-1]["role"] == "assistant"
        assert r["messages"] == c["messages"][:len(r["messages"])]  # the same first prompt and first answer
        if c["num_assistant_turns"] == 1:  # (a later turn's prompt holds earlier answers re-tokenized from text)
            assert (r["input_ids"], r["loss_mask"]) == (c["input_ids"], c["loss_mask"])
    assert len(clean["o5"]["messages"]) > len(got[0]["messages"])


def test_a_failed_batch_is_counted_and_a_retry_regenerates_only_its_shard(clean_run, source, tmp_path):
    clean_out, _ = clean_run
    # rows 4 (o5) and 6 (o7) are shard 1's live conversations: one generate call, failed by the test hook
    failed = run_regeneration(_cfg(source, tmp_path, **{"data.fail_row": 4}))
    c = failed["corpus"]
    assert c["shards"] == 3 and c["skipped"] == {**SKIPS, "generate_error": 2}
    (message, n), = c["generate_errors"].items()
    assert n == 2 and "data.fail_row=4" in message and "generate call of 2 prompts" in message
    assert {r["row_index"] for r in _rows(tmp_path)} == {r["row_index"] for r in _rows(clean_out)} - {4, 6}
    assert run_regeneration(_cfg(source, tmp_path))["this_run"]["shards"] == 0  # a plain rerun moves on
    retried = run_regeneration(_cfg(source, tmp_path, **{"data.retry_failed": "true"}))
    assert retried["this_run"]["shards"] == 1 and retried["corpus"]["skipped"] == SKIPS
    assert retried["corpus"]["generate_errors"] == {}
    assert _rows(tmp_path) == _rows(clean_out)


def test_engine_backend_refills_its_rows_when_a_call_has_more_prompts():
    """A call of 5 prompts on a decoder of data.batch_size=2 rows: the waiting prompts take rows as answers finish
    (continuous batching), and every answer is still the target's own greedy one."""
    cfg = load_config("tiny-random", TARGET + ["data.batch_size=2"])
    model, tok = assets.load_target(cfg.target)
    prompts = [prompt_ids(tok, [U(q)], False) for q in ("a", "Tell me about cats", "hi", "Why is the sky blue?", "x y")]
    engine = GreedyGenerator(model, tok, cfg, "engine")
    stop = tok.eos_token_id
    assert engine(prompts, 9, [stop]) == [hf_greedy(model, tok, p, 9, [stop]) for p in prompts]
    assert engine._decoder.max_batch == 2


def test_resume_with_different_settings_is_refused(clean_run, source):
    clean_out, _ = clean_run
    with pytest.raises(RuntimeError, match="max_new_tokens"):
        run_regeneration(_cfg(source, clean_out, **{"data.max_new_tokens": 5}))


def test_engine_backend_equals_transformers_and_stops_on_stop_ids():
    cfg = load_config("tiny-random", TARGET)
    model, tok = assets.load_target(cfg.target)
    prompts = [prompt_ids(tok, [U(q)], False) for q in ("Tell me about cats", "hi", "Write a long poem about the sea")]
    engine = GreedyGenerator(model, tok, cfg, "engine")
    free = engine(prompts, 10, [tok.eos_token_id])
    assert free == [hf_greedy(model, tok, p, 10, [tok.eos_token_id]) for p in prompts]
    stop = free[0][3]  # make the 4th token of the first answer a stop token
    cut = engine(prompts, 10, [stop])
    assert cut[0] == free[0][:free[0].index(stop) + 1]
    assert cut == [hf_greedy(model, tok, p, 10, [stop]) for p in prompts]
