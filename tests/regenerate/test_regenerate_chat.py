"""Regeneration without Ray: turn structure, the loss mask, reading and splitting, skip reasons."""

import json

import pytest

from lilicorr.config import load_config
from lilicorr.platform import assets
from lilicorr.platform.regenerate.actor import RegenSettings, regenerate_rows
from lilicorr.platform.regenerate.conversations import (AssistantTurn, SkipConversation, conversation_skeleton,
                                               prompt_ids, tokenize_with_loss_mask)
from lilicorr.platform.regenerate.read import Source, plan_shards, read_shard_rows, split_of


@pytest.fixture(scope="module")
def tok():
    return assets.load_target(load_config("tiny-random").target)[1]  # SmolLM2's tokenizer (ChatML)


def U(text):
    return {"role": "user", "content": text}


def A(text):
    return {"role": "assistant", "content": text}


def test_skeleton_keeps_system_and_users_and_drops_unanswerable_ends():
    sys_msg = {"role": "system", "content": "Be brief."}
    got = conversation_skeleton([sys_msg, A("orphan"), U("q1"), A("a1"), U("q2"), A("a2"), U("unanswered")])
    assert got == [sys_msg, U("q1"), A("a1"), U("q2"), A("a2")]
    assert conversation_skeleton([{"role": "system", "content": " "}, U("q"), A("a")]) == [U("q"), A("a")]


@pytest.mark.parametrize("messages, reason", [
    ([U("a"), U("b"), A("x")], "bad_role_order"),
    ([U("q"), A("x"), A("y")], "bad_role_order"),
    ([U("q"), A("x"), {"role": "system", "content": "late"}, A("y")], "bad_role_order"),
    ([U(" \n"), A("x")], "empty_turn"),
    ([U("q")], "no_assistant_turn"),
    ([], "no_assistant_turn"),
])
def test_skeleton_rejects_by_reason(messages, reason):
    with pytest.raises(SkipConversation) as e:
        conversation_skeleton(messages)
    assert e.value.reason == reason


def _segments(tok, pieces):
    """Concatenate token segments, each (text or ids, mask bit) -> (ids, mask): the hand-built reference."""
    ids, mask = [], []
    for piece, bit in pieces:
        seg = piece if isinstance(piece, list) else tok(piece, add_special_tokens=False)["input_ids"]
        ids += seg
        mask += [bit] * len(seg)
    return ids, mask


def test_loss_mask_is_exactly_the_assistant_tokens(tok):
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    last = tok("Sure, here it is", add_special_tokens=False)["input_ids"] + [eot]
    messages = [{"role": "system", "content": "Be brief."}, U("Name a color"), A("Blue"), U("Another one"),
                A("Sure, here it is")]
    turns = [AssistantTurn(tok("Blue", add_special_tokens=False)["input_ids"] + [eot], True),
             AssistantTurn(last, True)]
    ids, mask = tokenize_with_loss_mask(tok, messages, turns, [eot], enable_thinking=False)
    want_ids, want_mask = _segments(tok, [
        ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nName a color<|im_end|>\n"
         "<|im_start|>assistant\n", 0),
        ("Blue", 1), ([eot], 1),
        ("\n<|im_start|>user\nAnother one<|im_end|>\n<|im_start|>assistant\n", 0),
        (last, 1),
    ])
    assert ids == want_ids and mask == want_mask
    # The sequence starts with exactly the last turn's generation prompt.
    prompt = prompt_ids(tok, messages[:-1], enable_thinking=False)
    assert ids[:len(prompt)] == prompt and ids[len(prompt):] == last


def test_capped_turn_has_no_end_of_turn_in_the_mask(tok):
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    cut = tok("Blue and", add_special_tokens=False)["input_ids"]  # hit max_new_tokens: no stop token
    last = tok("Red", add_special_tokens=False)["input_ids"]
    messages = [U("Colors?"), A("Blue and"), U("More"), A("Red")]
    ids, mask = tokenize_with_loss_mask(tok, messages, [AssistantTurn(cut, False), AssistantTurn(last, False)],
                                        [eot], enable_thinking=False)
    default_system = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    want_ids, want_mask = _segments(tok, [
        (default_system + "<|im_start|>user\nColors?<|im_end|>\n<|im_start|>assistant\n", 0),
        ("Blue and", 1), ([eot], 0),  # the template closes the turn, but the target never produced it
        ("\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n", 0),
        (last, 1),
    ])
    assert ids == want_ids and mask == want_mask


def test_thinking_scaffold_is_masked_out(tok):
    """A Qwen3-style template: enable_thinking=False adds an empty think block, which is not assistant text."""
    tok2 = tok.__class__.from_pretrained(tok.name_or_path) if tok.name_or_path else tok
    tok2.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
        "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
        "{% endif %}")
    eot = tok2.convert_tokens_to_ids("<|im_end|>")
    prompt = prompt_ids(tok2, [U("Hi")], enable_thinking=False)
    assert tok2.decode(prompt).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not tok2.decode(prompt_ids(tok2, [U("Hi")], enable_thinking=True)).endswith("</think>\n\n")
    gen = tok2("Hello", add_special_tokens=False)["input_ids"] + [eot]
    ids, mask = tokenize_with_loss_mask(tok2, [U("Hi"), A("Hello")], [AssistantTurn(gen, True)], [eot], False)
    assert ids == prompt + gen and mask == [0] * len(prompt) + [1] * len(gen)


def _raw(i, turns, error=""):
    return {"row_index": i, "id": f"c{i}", "split": "train", "shard": 0, "turns": json.dumps(turns), "error": error}


def test_turns_are_regenerated_in_order_and_see_earlier_answers(tok):
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    seen_prompts = []

    def fake_generate(prompts, max_new, stops):  # answer k of a conversation is "Answer<k>"
        seen_prompts.append([tok.decode(p) for p in prompts])
        return [tok(f" Answer{tok.decode(p).count('<|im_start|>assistant')}", add_special_tokens=False)["input_ids"]
                + [eot] for p in prompts]

    rows = [_raw(0, [{"from": "human", "value": "q1"}, {"from": "gpt", "value": "old1"},
                     {"from": "human", "value": "q2"}, {"from": "gpt", "value": "old2"}]),
            _raw(1, [{"role": "user", "content": "only"}, {"role": "assistant", "content": "old"}]),
            _raw(2, None, error="turn 0 has unknown role 'robot'"),
            _raw(3, "not a list")]
    out = regenerate_rows(rows, tok, fake_generate, RegenSettings(16, 1000, [eot]))
    assert [r["skip_reason"] for r in out] == ["", "", "malformed", "malformed"]
    assert [len(p) for p in seen_prompts] == [2, 1]  # turn 1 of both conversations, then turn 2 of the first
    assert seen_prompts[1][0].endswith("q1<|im_end|>\n<|im_start|>assistant\n Answer1<|im_end|>\n"
                                       "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n")
    assert [m["content"] for m in out[0]["messages"]] == ["q1", " Answer1", "q2", " Answer2"]
    assert "old" not in json.dumps(out[0]["messages"]) and out[0]["generated_tokens"] == 2 * (len(
        tok(" Answer1", add_special_tokens=False)["input_ids"]) + 1)


def test_long_prompts_are_skipped_or_cut_at_the_turn(tok):
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    long_text = "word " * 200
    rows = [_raw(0, [U(long_text), A("x")]),
            _raw(1, [U("short"), A("x"), U(long_text), A("y")])]
    out = regenerate_rows(rows, tok, lambda ps, n, s: [[eot] for _ in ps], RegenSettings(8, 100, [eot]))
    assert out[0]["skip_reason"] == "prompt_too_long"
    assert out[1]["skip_reason"] == "" and out[1]["num_assistant_turns"] == 1 and out[1]["turns_dropped"] == 1
    assert [m["role"] for m in out[1]["messages"]] == ["user", "assistant"]


def test_split_is_deterministic_keeps_sharegpt_parts_together_and_has_the_fraction():
    assert split_of("abc", 0.3) == split_of("abc", 0.3)
    assert all(split_of(f"X{i}_0", 0.5) == split_of(f"X{i}_7", 0.5) for i in range(50))
    n = sum(split_of(f"conv-{i}", 0.2) == "heldout" for i in range(4000))
    assert 0.17 < n / 4000 < 0.23
    assert split_of("conv-1", 0.0) == "train" and split_of("conv-1", 1.0) == "heldout"


def test_jsonl_shards_cover_every_line_once_with_bad_lines_marked(tmp_path):
    path = tmp_path / "c.jsonl"
    lines = [json.dumps({"id": f"r{i}", "messages": [U(f"q{i}"), A("a")]}) for i in range(7)]
    lines[3] = "{broken"
    path.write_text("\n".join(lines) + "\n")
    src = Source("jsonl", str(path), str(path))
    plan = plan_shards(src, 7, 3)
    assert [(t.start, t.stop) for t in plan] == [(0, 3), (3, 6), (6, 7)]
    rows = [r for t in plan for r in read_shard_rows(t.__dict__, src=src, heldout_fraction=0.0)]
    assert [r["row_index"] for r in rows] == list(range(7))
    assert [r["id"] for r in rows] == ["r0", "r1", "r2", "row-3", "r4", "r5", "r6"]
    assert rows[3]["error"].startswith("invalid JSON") and all(not r["error"] for i, r in enumerate(rows) if i != 3)
    assert json.loads(rows[6]["turns"]) == [U("q6"), A("a")]


def test_a_template_that_refuses_a_conversation_skips_it(tok):
    strict = tok.__class__.from_pretrained(tok.name_or_path)
    strict.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' %}"
                            "{{ raise_exception('System role not supported') }}{% endif %}"
                            "{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
                            "{% if add_generation_prompt %}assistant: {% endif %}")
    eot = strict.convert_tokens_to_ids("<|im_end|>")
    rows = [_raw(0, [{"role": "system", "content": "S"}, U("q"), A("a")]), _raw(1, [U("q"), A("a")])]
    out = regenerate_rows(rows, strict, lambda ps, n, s: [[eot] for _ in ps], RegenSettings(8, 100, [eot]))
    assert out[0]["skip_reason"] == "template_error" and "System role not supported" in out[0]["skip_detail"]
    assert out[1]["skip_reason"] == "" and out[1]["input_ids"][-1] == eot
