"""Regeneration at scale without Ray: prompts grouped by length, a failing generate call skips only its rows
(counted with its reason), resume reschedules failed shards only when asked, and the qwen3 preset's cache fits."""

import json

import pyarrow as pa
import pytest

from lilicorr.config import DataConfig, load_config
from lilicorr.platform import assets
from lilicorr.platform.chat import prompt_ids
from lilicorr.platform.regenerate.actor import RegenSettings, call_rows, output_schema, regenerate_rows
from lilicorr.platform.regenerate.pipeline import pending_shards
from lilicorr.platform.regenerate.read import ShardTask
from lilicorr.platform.regenerate.shards import ShardStore
from lilicorr.platform.regenerate.summary import format_summary, shard_counts, summary, total

OOM = "CUDA out of memory. Tried to allocate 2.00 GiB"


@pytest.fixture(scope="module")
def tok():
    return assets.load_target(load_config("tiny-random").target)[1]


@pytest.fixture(scope="module")
def eot(tok):
    return tok.convert_tokens_to_ids("<|im_end|>")


def _raw(i, turns, shard=0):
    return {"row_index": i, "id": f"c{i}", "split": "train", "shard": shard, "turns": json.dumps(turns), "error": ""}


def _chat(*texts):
    out = []
    for t in texts:
        out += [{"role": "user", "content": t}, {"role": "assistant", "content": "old"}]
    return out


class Recorder:
    """A generate fn answering " Answer<prompt length>" (so each output names the prompt it belongs to)."""

    def __init__(self, tok, eot, fail_if=None):
        self.tok, self.eot, self.fail_if, self.calls = tok, eot, fail_if, []

    def __call__(self, prompts, max_new, stops):
        self.calls.append([len(p) for p in prompts])
        if self.fail_if is not None and any(self.fail_if in self.tok.decode(p) for p in prompts):
            raise RuntimeError(OOM)
        return [self.tok(f" Answer{len(p)}", add_special_tokens=False)["input_ids"] + [self.eot] for p in prompts]


LENGTHS = [30, 2, 17, 5, 40, 1]  # words per user message, in row order: sorted rows 5 1 3 2 0 4


def _len(tok, text):
    return len(prompt_ids(tok, [{"role": "user", "content": text}], False))


def test_prompts_are_sorted_by_length_batched_and_answers_go_back_to_their_rows(tok, eot):
    gen = Recorder(tok, eot)
    rows = [_raw(i, _chat("w " * n)) for i, n in enumerate(LENGTHS)]
    out = regenerate_rows(rows, tok, gen, RegenSettings(8, 1000, [eot], batch_size=2))
    lens = [_len(tok, "w " * n) for n in LENGTHS]
    assert gen.calls == [[lens[5], lens[1]], [lens[3], lens[2]], [lens[0], lens[4]]]  # one turn, three batches
    for r, n in zip(out, lens):  # the answer is the one generated for this row's own prompt
        assert r["skip_reason"] == "" and r["messages"][-1]["content"] == f" Answer{n}"


def test_groups_are_aligned_row_blocks_within_a_shard(tok, eot):
    gen = Recorder(tok, eot)
    rows = [_raw(i, _chat("w " * (10 - i))) for i in range(4)] + [_raw(4, _chat("w")), _raw(5, _chat("w w"), shard=1)]
    regenerate_rows(rows, tok, gen, RegenSettings(8, 1000, [eot], batch_size=8, group_rows=2))
    # blocks {0,1} {2,3} {4} of shard 0 and {5} of shard 1, each sorted on its own: never mixed in a call
    lens = [_len(tok, "w " * (10 - i)) for i in range(4)]
    assert gen.calls == [[lens[1], lens[0]], [lens[3], lens[2]], [_len(tok, "w")], [_len(tok, "w w")]]


def test_a_failing_batch_skips_its_conversations_and_the_others_go_on(tok, eot):
    gen = Recorder(tok, eot, fail_if="BOOM")
    # turn 1 sorted: [r0 r1] [r2 r3] [r4]: r3 shares the failing call of r2; r0 fails at its second turn
    rows = [_raw(0, _chat("short", "then BOOM")), _raw(1, _chat("tiny")), _raw(2, _chat("BOOM " * 8)),
            _raw(3, _chat("w " * 16)), _raw(4, _chat("w " * 40))]
    assert _len(tok, "BOOM " * 8) == _len(tok, "w " * 16) < _len(tok, "w " * 40)
    out = regenerate_rows(rows, tok, gen, RegenSettings(8, 1000, [eot], batch_size=2))
    assert [r["skip_reason"] for r in out] == ["generate_error", "", "generate_error", "generate_error", ""]
    assert [len(c) for c in gen.calls] == [2, 2, 1, 1]
    assert out[3]["skip_detail"] == f"generate_error: RuntimeError in a generate call of 2 prompts (longest 47 tokens): {OOM}"
    assert out[0]["skip_detail"].startswith("generate_error: RuntimeError in a generate call of 1 prompt (longest ")
    assert out[0]["input_ids"] == [] and out[0]["generated_tokens"] == 0
    assert out[4]["messages"][-1]["content"] == f" Answer{_len(tok, 'w ' * 40)}"

    counts = shard_counts(pa.Table.from_pylist(out, schema=output_schema()))
    assert counts["skipped"] == {"generate_error": 3} and counts["rows_out"]["train"] == 2
    assert sorted(counts["generate_errors"].values()) == [1, 2]  # two failed calls: 1 row and 2 rows
    corpus = total([counts, counts])
    assert corpus["skipped"] == {"generate_error": 6} and corpus["generate_errors"][out[3]["skip_detail"]] == 4
    text = format_summary(summary(corpus, corpus, 1.0, "out"))
    assert f"     4 rows  {out[3]['skip_detail']}" in text and "data.retry_failed=true" in text


def test_the_fail_row_hook_fails_the_batch_holding_that_row(tok, eot):
    gen = Recorder(tok, eot)
    rows = [_raw(i, _chat("w " * n)) for i, n in enumerate(LENGTHS)]
    out = regenerate_rows(rows, tok, gen, RegenSettings(8, 1000, [eot], batch_size=2, fail_row=3))
    # row 3 sorts beside row 2: their batch never reaches generate, the other two batches do
    assert [r["skip_reason"] for r in out] == ["", "", "generate_error", "generate_error", "", ""]
    assert "data.fail_row=3" in out[2]["skip_detail"] and len(gen.calls) == 2


def test_resume_reschedules_failed_shards_only_with_retry_failed(tmp_path):
    cfg = load_config("tiny-random", [f"data.output_dir={tmp_path}"])
    plan = [ShardTask(s, 4 * s, 4 * s + 4, 0) for s in range(3)]
    store = ShardStore(str(tmp_path))
    store.open(cfg, 12, 3)
    empty = pa.Table.from_pylist([], schema=output_schema())
    ok = {"rows_in": 4, "rows_out": {"train": 4, "heldout": 0}, "skipped": {}}
    store.write_shard(0, 0, 4, {"train": empty}, ok)
    store.write_shard(1, 4, 8, {"train": empty},
                      {**ok, "skipped": {"generate_error": 2}, "generate_errors": {OOM: 2}})
    assert [t.shard for t in pending_shards(plan, store)] == [2]  # a rerun moves on past the failure
    assert [t.shard for t in pending_shards(plan, store, retry_failed=True)] == [1, 2]


def test_call_rows_is_the_sorting_group_capped_at_a_shard():
    assert call_rows(DataConfig(batch_size=32, sort_window=16, rows_per_shard=2048)) == 512
    assert call_rows(DataConfig(batch_size=4, sort_window=8, rows_per_shard=4)) == 4
    assert call_rows(DataConfig(batch_size=8, sort_window=1, rows_per_shard=256)) == 8


@pytest.mark.parametrize("preset", ["qwen3-4b", "qwen3-8b"])
def test_qwen3_regeneration_cache_fits_an_80gb_card_beside_the_target(preset):
    d = load_config(preset).data
    assert d.max_prompt_tokens == 4096 and d.max_new_tokens == 4096 and d.batch_size == 32
    assert d.rows_per_shard % call_rows(d) == 0  # calls never straddle shards
    # generate.py sizes the cache: longest prompt + cap + 1 rounded up to 256, + 2 positions of slack (AR block)
    positions = -(-(d.max_prompt_tokens + d.max_new_tokens + 1) // 256) * 256 + 2
    per_token = 36 * 2 * 8 * 128 * 2  # Qwen3-4B/8B layers x (K, V) x kv heads x head_dim x bf16
    assert (per_token, positions) == (147_456, 8_450)
    assert per_token * d.batch_size * positions == 39_872_102_400 < 80e9 - 16.4e9


def test_a_failed_engine_call_drops_the_decoder_and_the_next_call_is_unaffected(eot):
    from lilicorr.platform.regenerate.generate import GreedyGenerator

    cfg = load_config("tiny-random", ["target.tie_word_embeddings=false", "target.seed=1"])
    model, tok = assets.load_target(cfg.target)
    gen = GreedyGenerator(model, tok, cfg)
    prompts = [[5, 6, 7, 8], [9, 10]]
    first = gen(prompts, 6, [eot])
    decoder = gen._decoder

    def boom(requests):
        for r in requests:  # a call that dies mid-way, its requests left in the slots
            decoder.add_request(r)
        raise RuntimeError(OOM)

    decoder.generate = boom
    with pytest.raises(RuntimeError, match="out of memory"):
        gen(prompts, 6, [eot])
    assert gen._decoder is None and gen._decoder_shape == (0, 0)
    assert gen(prompts, 6, [eot]) == first and gen._decoder is not decoder
