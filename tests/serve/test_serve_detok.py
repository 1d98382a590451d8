"""Incremental detokenization and stop strings against the real SmolLM2 tokenizer (no model, no Ray)."""

from __future__ import annotations

import random

import pytest

from lilicorr.serve_apps.detok import IncrementalDetokenizer, TextStream


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from lilicorr.platform.assets import smollm2_dir

    return AutoTokenizer.from_pretrained(str(smollm2_dir()))


def _chunks(ids, rng):
    i = 0
    while i < len(ids):
        n = rng.randint(1, 5)
        yield ids[i:i + n]
        i += n


def test_deltas_concatenate_to_the_full_decode(tok):
    rng = random.Random(0)
    texts = ["Hello, world! Naïve café — 東京タワー 🚀🚀 done.", "def f(x):\n    return x ** 2  # ok",
             "   leading spaces\tand\ttabs\n\n\nnewlines"]
    cases = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    cases += [[rng.randrange(len(tok)) for _ in range(60)] for _ in range(20)]  # random ids, specials included
    for ids in cases:
        d = IncrementalDetokenizer(tok)
        out = "".join(d.add(c) for c in _chunks(ids, rng)) + d.add([], final=True)
        assert out == tok.decode(ids, skip_special_tokens=True)


def test_multibyte_character_is_never_split(tok):
    ids = tok("🚀", add_special_tokens=False)["input_ids"]
    assert len(ids) > 1  # byte-level BPE splits the emoji's 4 bytes over several tokens
    d = IncrementalDetokenizer(tok)
    pieces = [d.add([t]) for t in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == "🚀"


def _run(tok, text, stops, seed=0):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    s = TextStream(tok, stops)
    out = []
    for c in _chunks(ids, random.Random(seed)):
        out.append(s.add(c))
        if s.stopped:
            break
    if not s.stopped:
        out.append(s.add([], final=True))
    return "".join(out), s.stopped, out


def test_stop_string_cuts_text_before_it(tok):
    text = "The answer is 42.\nUser: next question"
    for seed in range(5):
        out, stopped, _ = _run(tok, text, ["\nUser:"], seed)
        assert stopped and out == "The answer is 42."
    out, stopped, _ = _run(tok, text, ["zzz", "is 4"])  # the earliest occurrence wins
    assert stopped and out == "The answer "


def test_no_stop_gives_everything_and_partial_prefix_is_released(tok):
    text = "abc Use the User"
    out, stopped, _ = _run(tok, text, ["User:"])
    assert not stopped and out == text  # "User" was held back (could become "User:") then released


def test_held_back_text_never_contains_a_stop_prefix_that_completes_later(tok):
    text = "one two END three"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    s = TextStream(tok, ["END"])
    sent = ""
    for t in ids:
        sent += s.add([t])
        assert "E" not in sent  # "E", "EN" may still become "END": held back, never sent
        if s.stopped:
            break
    assert sent == "one two "
