"""Issue 41's packaged benchmarks beyond single first turns: MT-Bench's second turns after the target's own greedy
answer, AlpacaEval from alpaca-eval's pinned sdist, and the long-input prompts of exact token lengths; the YaRN
extension of the target (target.yarn_factor) against transformers' own model, the refusal of a prompt past the
target's positions and of caches that do not fit memory."""

from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from lilicorr.config import load_config
from lilicorr.engine.requests import Request
from lilicorr.engine.systems import build_decoder
from lilicorr.platform.evaluate.benchmarks import load_benchmark

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def worker(one_torch_thread):
    from lilicorr.platform.evaluate.workers import EvalWorker

    cfg = load_config("tiny-random", ["engine.max_new_tokens=2", "eval.turn1_max_tokens=5"])
    return EvalWorker(cfg.to_dict(), threads=1, use_gpu=False)


def _decode_one(worker, name):
    from lilicorr.platform.evaluate.plan import Cell

    rows = load_benchmark(name, 1).rows
    [res] = worker.run_setting([asdict(Cell("ar", name, 0.0, 0, 1))], rows, {"ar": None}, False)
    assert "error" not in res, res.get("error")
    assert res["metrics"]["generated_tokens"] == 2 and res["outputs"][0]["id"] == rows[0]["id"]
    return rows


def test_mt_bench_turn2_asks_turn_two_after_the_targets_own_greedy_answer(worker):
    """The turn-1 answer is what transformers' own greedy `generate` of the target says (5 tokens, eval.turn1_max_tokens),
    and the decoded prompt is turn 1, that answer, turn 2 in the chat template."""
    from lilicorr.platform.benchmark_prompts import fill_target_turns, rows_prompt_ids, target_answerer
    from lilicorr.platform.chat import prompt_ids, render

    rows = _decode_one(worker, "mt-bench-turn2")
    assert len(load_benchmark("mt-bench-turn2").rows) == 80
    q1, a1, q2 = rows[0]["messages"]
    assert a1 == {"role": "assistant", "content": None} and "Rewrite your previous response" in q2["content"]
    tok, model = worker.tokenizer, worker.model
    filled = fill_target_turns(rows, target_answerer(worker.cfg, model, tok, worker.stop_ids))
    ids = torch.tensor([prompt_ids(tok, [q1], False)])
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False,
                         eos_token_id=worker.stop_ids, pad_token_id=tok.pad_token_id)[0, ids.shape[1]:]
    answer = filled[0]["messages"][1]["content"]
    assert answer == tok.decode(ref, skip_special_tokens=True) and rows[0]["messages"][1]["content"] is None
    text = render(tok, filled[0]["messages"], False)
    assert text.index(q1["content"]) < text.index(answer) < text.index(q2["content"])
    assert rows_prompt_ids(tok, filled, False)[0] == prompt_ids(tok, filled[0]["messages"], False)
    with pytest.raises(ValueError, match="fill_target_turns"):
        rows_prompt_ids(tok, rows, False)


def test_alpaca_reads_the_805_instructions_from_the_pinned_sdist(worker):
    assert "alpaca-eval==0.6.6 --hash=sha256:" in (REPO / "requirements-sdists.txt").read_text()
    assert "requirements-sdists.txt" in (REPO / "Makefile").read_text()
    b = load_benchmark("alpaca")
    assert b.skipped is None and len(b.rows) == 805 and len({r["id"] for r in b.rows}) == 805
    assert b.rows[0]["messages"][0]["content"].startswith("What are the names of some famous actors")
    assert {r["category"] for r in b.rows} == {"helpful_base", "koala", "oasst", "selfinstruct", "vicuna"}
    _decode_one(worker, "alpaca")


def test_alpaca_without_the_sdist_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("LILICORR_CACHE", str(tmp_path))
    b = load_benchmark("alpaca", 1)
    assert b.rows == [] and "make install" in b.skipped and "requirements-sdists.txt" in b.skipped


@pytest.mark.parametrize("name, tokens", [("long-2k", 1792), ("long-16k", 16128)])
def test_long_prompts_have_their_exact_length_in_the_chat_template(name, tokens):
    from lilicorr.platform.assets import load_tokenizer
    from lilicorr.platform.benchmark_prompts import rows_prompt_ids

    tok = load_tokenizer(load_config("smollm2-135m").target)  # the embedded target's tokenizer
    b = load_benchmark(name, 2)
    assert b.skipped is None and len(load_benchmark(name).rows) == 64
    ids = rows_prompt_ids(tok, b.rows, False)
    assert [len(i) for i in ids] == [tokens, tokens]
    text = tok.decode(ids[0])
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    assert "Question: Were Scott Derrickson and Ed Wood of the same nationality?<|im_end|>" in text
    assert "Document 1:\nEd Wood (film)" in text  # the question's own paragraphs come first


def test_long_2k_decodes_one_prompt_through_the_evaluation(worker):
    _decode_one(worker, "long-2k")  # tiny-random: 2,048 positions hold 1,792 + 2


def test_prompt_past_the_targets_positions_is_refused_naming_yarn_and_decodes_with_it(one_torch_thread):
    from lilicorr.platform.assets import load_target

    prompt = list(range(100, 100 + 2100))  # tiny-random: max_position_embeddings 2048
    for overrides, ok in [([], False), (["target.yarn_factor=2"], True)]:
        cfg = load_config("tiny-random", ["engine.max_seq_len=2200", *overrides])
        model, _ = load_target(cfg.target)
        [res] = build_decoder(cfg, model, "ar").generate([Request(0, prompt, max_new_tokens=2)])
        if ok:
            assert res.error is None and len(res.output_ids) == 2
            assert model.config.max_position_embeddings == 4096
        else:
            assert "2048 positions" in res.error and "target.yarn_factor=2" in res.error
    cfg = load_config("tiny-random", ["engine.max_seq_len=2200"])
    model, _ = load_target(cfg.target)
    [res] = build_decoder(cfg, model, "ar").generate([Request(0, prompt[:2044], max_new_tokens=32)])
    assert res.error is None and len(res.output_ids) == 4 and res.finish_reason == "length"  # 2,048 positions


def test_caches_past_free_memory_are_refused_before_allocating(one_torch_thread):
    from lilicorr.engine.kv_cache import KVCacheTooLarge
    from lilicorr.platform.assets import load_target

    cfg = load_config("tiny-random", ["engine.max_seq_len=200000000"])  # ~1 KB a position: ~200 GB
    model, _ = load_target(cfg.target)
    with pytest.raises(KVCacheTooLarge, match="lower engine.max_batch_size"):
        build_decoder(cfg, model, "ar")


def test_yarn_factor_rejects_a_factor_of_one():
    from lilicorr.config import ConfigError

    with pytest.raises(ConfigError, match="target.yarn_factor=1.0 must be > 1"):
        load_config("tiny-random", ["target.yarn_factor=1"])


@pytest.mark.slow
def test_yarn_smollm2_matches_transformers_own_yarn_model():
    """target.yarn_factor=2 on the embedded SmolLM2: our forward's logits equal transformers' model built from the
    checkpoint with the same yarn rope_parameters set by hand, and differ from the unscaled model's."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from lilicorr.engine.target_forward import TargetForward
    from lilicorr.platform.assets import load_target, smollm2_dir

    cfg = load_config("smollm2-135m", ["target.yarn_factor=2"])
    model, tok = load_target(cfg.target)
    assert model.config.max_position_embeddings == 16384
    ref_cfg = AutoConfig.from_pretrained(str(smollm2_dir()))
    ref_cfg.rope_parameters = {"rope_type": "yarn", "rope_theta": 100000.0, "factor": 2.0,
                               "original_max_position_embeddings": 8192}
    ref_cfg.max_position_embeddings = 16384
    ref_model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir()), config=ref_cfg, dtype=torch.float32).eval()
    plain = AutoModelForCausalLM.from_pretrained(str(smollm2_dir()), dtype=torch.float32).eval()
    ids = torch.tensor([tok("The printing press spread literacy across Europe within fifty years.")["input_ids"]])
    with torch.no_grad():
        ref, unscaled = ref_model(ids).logits, plain(ids).logits
    tf = TargetForward(model)
    ours = tf(ids, tf.new_cache(1, ids.shape[1]), slice(0, 1), kv_len=ids.shape[1]).logits
    assert (ours - ref).abs().max() < 1e-4
    assert (ref - unscaled).abs().max() > 1e-2  # YaRN changes the logits (its attention factor, low frequencies)


@pytest.mark.slow
def test_long_16k_on_smollm2_without_yarn_is_refused_naming_the_fix():
    from lilicorr.platform.assets import eos_token_ids, load_target
    from lilicorr.platform.benchmark_prompts import rows_prompt_ids

    cfg = load_config("smollm2-135m", ["engine.max_seq_len=16200"])
    model, tok = load_target(cfg.target)
    [ids] = rows_prompt_ids(tok, load_benchmark("long-16k", 1).rows, False)
    dec = build_decoder(cfg, model, "ar", stop_ids=eos_token_ids(cfg.target, tok), max_batch=1)
    [res] = dec.generate([Request(0, ids, max_new_tokens=4)])
    assert "16128 tokens" in res.error and "8192 positions" in res.error and "target.yarn_factor=2" in res.error


def test_generate_takes_a_packaged_benchmark_name(tmp_path, one_torch_thread):
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("jobs_generate", REPO / "jobs" / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    out = tmp_path / "out.jsonl"
    summary = generate.main(["--preset", "tiny-random", "--system", "ar", "--prompts", "mt-bench-turn2",
                             "--num-prompts", "1", "--max-new-tokens", "2", "--no-warmup", "--out", str(out),
                             "eval.turn1_max_tokens=3"])
    [row] = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["errors"] == 0 and row["id"] == "mtbench-81-turn2" and len(row["output_ids"]) == 2
