"""Embedded assets from packages, and hub loaders that fail fast offline."""

import time

import pyarrow.parquet as pq
import pytest
import torch

from lilicorr.config import load_config
from lilicorr.platform import assets


def test_sharegpt_parquet_rows_have_normalised_roles():
    table = pq.read_table(assets.sharegpt_parquet())
    assert table.num_rows > 10_000
    assert set(table.column_names) >= {"id", "messages", "error"}
    sample = table.slice(0, 200).to_pylist()
    roles = {m["role"] for row in sample for m in row["messages"]}
    assert roles <= {"system", "user", "assistant"} and {"user", "assistant"} <= roles
    assert len({row["id"] for row in sample}) == len(sample)


def test_iter_json_array_tolerates_truncated_tail():
    items = list(assets.iter_json_array('[{"a": 1}, {"b": [2, 3]}, {"c": "unterminated'))
    assert items[:2] == [{"a": 1}, {"b": [2, 3]}]
    assert isinstance(items[2], ValueError) and len(items) == 3
    assert list(assets.iter_json_array("[1, 2]")) == [1, 2]


def test_normalize_messages_maps_sharegpt_and_openai_roles():
    got = assets.normalize_messages([{"from": "human", "value": "hi"}, {"role": "assistant", "content": "yo"}])
    assert got == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    with pytest.raises(ValueError, match="unknown role 'robot'"):
        assets.normalize_messages([{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError, match="turn 0 content"):
        assets.normalize_messages([{"role": "user", "content": None}])


def test_mt_bench_and_humaneval_are_complete():
    mt = assets.mt_bench()
    assert len(mt) == 80 and all(len(q["turns"]) == 2 for q in mt)
    he = assets.humaneval()
    assert len(he) == 164 and he[0]["id"] == "HumanEval/0" and "def " in he[0]["prompt"]
    from lilicorr.platform.benchmark_prompts import benchmark_prompts

    prompts = benchmark_prompts("mt-bench")
    assert prompts[0]["messages"][0]["role"] == "user"


@pytest.mark.parametrize("call, names", [
    (lambda: assets.load_target(load_config("qwen3-8b").target), "Qwen/Qwen3-8B"),
])
def test_hub_assets_fail_fast_offline(call, names, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(assets.AssetUnavailable, match=names) as err:
        call()
    assert "embedded:smollm2-135m" in str(err.value)  # names the packaged alternative
    assert time.perf_counter() - start < 2.0


def test_missing_package_names_the_package():
    with pytest.raises(assets.AssetUnavailable, match="no-such-dist"):
        assets.packaged_file("no-such-dist", "x.bin")


@pytest.mark.slow
def test_converted_smollm2_matches_gguf_logits():
    from transformers import AutoModelForCausalLM

    folder = assets.smollm2_dir()
    assert not any(p.suffix == ".gguf" for p in folder.iterdir())
    converted, tok = assets.load_target(load_config("smollm2-135m").target)
    gguf = assets.packaged_file(assets.SMOLLM2_DIST, assets.SMOLLM2_FILE)
    reference = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    ids = tok.apply_chat_template([{"role": "user", "content": "Name three primary colors."}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        a = converted(ids).logits
        b = reference(ids).logits
    assert converted.config.num_hidden_layers == 30 and converted.config.hidden_size == 576
    assert (a - b).abs().max().item() < 1e-4
    assert tok.eos_token == "<|im_end|>" and tok.chat_template


def test_packaged_qwen3_tokenizer_gives_qwen3_ids_and_chat_prompt():
    tok = assets.qwen3_tokenizer()
    assert tok("Hello world 123")["input_ids"] == [9707, 1879, 220, 16, 17, 18]  # Qwen2/3 BPE, single digits
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]) == [
        151643, 151644, 151645, 151667, 151668]
    assert len(tok) == 151669  # 151669 (the DFlash mask id) and above stay unused up to the 151,936-row vocabulary
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True,
                                     enable_thinking=False)
    assert prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_generation_stops_on_the_chat_templates_end_of_turn():
    """The stop token is the one the template writes after an answer (<|im_end|>); a tokenizer whose eos_token is
    another (transformers 5.17 reads SmolLM2's GGUF with eos <|im_start|>) is refused, naming the override."""
    from lilicorr.platform.chat import end_of_turn_id

    cfg = load_config("smollm2-135m").target
    tok = assets.load_tokenizer(cfg)
    assert end_of_turn_id(tok) == tok.convert_tokens_to_ids("<|im_end|>") == 2
    assert assets.eos_token_ids(cfg, tok) == [2]
    assert end_of_turn_id(assets.qwen3_tokenizer()) == 151645
    tok.eos_token = "<|im_start|>"
    with pytest.raises(assets.AssetUnavailable, match=r"target\.eos_token_ids=\[2\]"):
        assets.eos_token_ids(cfg, tok)
    assert assets.eos_token_ids(load_config("smollm2-135m", ["target.eos_token_ids=[2]"]).target, tok) == [2]
