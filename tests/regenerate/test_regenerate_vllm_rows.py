"""data.generate_backend=vllm without vLLM: requests and outputs against hand-built vLLM-shaped outputs, and the
whole vllm path (waves, rows, resume, counted bad rows) with our engine standing in for Ray Data LLM's vLLM stage.

The real vLLM engine is checked by `jobs/bench.py regen-vllm` (.venv-vllm, not part of make test).
`FakeRequestOutput` / `FakeCompletion` mirror the fields of vllm.outputs.RequestOutput / CompletionOutput that Ray
2.60's vLLMOutputData.from_vllm_engine_output reads (prompt_token_ids, outputs[0].token_ids; text is left out:
our requests ask for detokenize=False) and vllm_rows.output_row reads in the offline check.
"""

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lilicorr.config import ConfigError, load_config
from lilicorr.platform import assets
from lilicorr.platform.regenerate import vllm_processor, vllm_rows
from lilicorr.platform.regenerate.actor import regen_settings, regenerate_rows
from lilicorr.platform.regenerate.conversations import EMPTY_GENERATION, GENERATE_ERROR, SkipConversation
from lilicorr.platform.regenerate.generate import GreedyGenerator
from lilicorr.platform.regenerate.pipeline import run_regeneration
from lilicorr.platform.regenerate.read import plan_shards, read_shard_rows, resolve_source
from lilicorr.platform.regenerate.shards import read_split

ROOT = Path(__file__).resolve().parents[2]
TARGET = ["target.tie_word_embeddings=false", "target.seed=1"]  # as test_regenerate_pipeline: answers vary


@dataclass
class FakeCompletion:
    token_ids: list[int]
    finish_reason: str = "stop"


@dataclass
class FakeRequestOutput:
    prompt_token_ids: list[int]
    outputs: list[FakeCompletion] = field(default_factory=list)


def _out(prompt, gen, max_new=8, stops=(2,)):
    req = vllm_rows.preprocess(vllm_rows.requests([prompt], max_new, list(stops))[0])
    return vllm_rows.output_row(req, FakeRequestOutput(list(prompt), [FakeCompletion(list(gen))]))


# ----------------------------------------------------------------------------- requests and outputs


def test_preprocess_builds_the_vllm_stage_inputs_greedy_with_our_stop_ids():
    cfg = load_config("smollm2-135m")
    tok = assets.load_tokenizer(cfg.target)
    stops = assets.eos_token_ids(cfg.target, tok)
    row = vllm_rows.preprocess(vllm_rows.requests([[5, 6, 7]], 64, stops)[0])
    assert row["tokenized_prompt"] == [5, 6, 7] and row["request_key"] == 0 and row["prompt_len"] == 3
    # the engine backend's stop: exactly our stop ids, the eos of a generation_config ignored
    assert row["sampling_params"] == {"temperature": 0.0, "max_tokens": 64, "stop_token_ids": stops,
                                      "ignore_eos": True, "detokenize": False}
    assert "prompt" not in row  # token ids only: vLLM must not re-tokenize or template


def test_postprocess_keeps_ids_up_to_the_stop_and_counts_bad_outputs():
    assert vllm_rows.postprocess(_out([1, 2, 3], [9, 8, 2])) == [9, 8, 2]  # stopped: the stop id kept
    assert vllm_rows.postprocess(_out([1, 2, 3], [9, 8, 7], max_new=3)) == [9, 8, 7]  # capped, no stop
    assert vllm_rows.postprocess(_out([1], [9, 2, 5, 6])) == [9, 2]  # never past the first stop id
    assert vllm_rows.postprocess(_out([1], [9, 8, 7, 6], max_new=2)) == [9, 8]  # never past max_new_tokens
    empty = vllm_rows.postprocess(_out([1], []))
    assert isinstance(empty, SkipConversation) and empty.reason == EMPTY_GENERATION
    failed = vllm_rows.postprocess({**_out([1], [9]), vllm_rows.ERROR: "EngineGenerateError: boom"})
    assert isinstance(failed, SkipConversation) and failed.reason == GENERATE_ERROR and "boom" in str(failed)
    bos = vllm_rows.postprocess({**_out([1, 2], [9]), "prompt_token_ids": [0, 1, 2]})  # vLLM added a token
    assert isinstance(bos, SkipConversation) and bos.reason == GENERATE_ERROR and "3-token prompt" in str(bos)
    # Ray's error rows (should_continue_on_error) carry defaults: generated_tokens [] and no prompt ids
    ray_error = {"request_key": 0, "prompt_len": 1, "max_new_tokens": 8, "stop_ids": [2], "generated_tokens": [],
                 "prompt_token_ids": None, vllm_rows.ERROR: "ValueError: too long"}
    assert vllm_rows.postprocess(ray_error).reason == GENERATE_ERROR
    import numpy as np  # what Ray Data's take_all gives for list columns

    arrays = {**_out([1, 2], [9, 2]), "prompt_token_ids": np.array([1, 2]), "generated_tokens": np.array([9, 2])}
    assert vllm_rows.postprocess(arrays) == [9, 2]


def test_request_generate_matches_answers_by_key_in_any_order():
    def run(reqs):  # answers come back reversed, the second request has no row at all
        rows = [vllm_rows.output_row(vllm_rows.preprocess(r), FakeRequestOutput(r["prompt_ids"], [FakeCompletion(
            [100 + r["request_key"], 2])])) for r in reqs]
        return [r for r in rows if r["request_key"] != 1][::-1]

    got = vllm_rows.RequestGenerate(run)([[1], [1, 2], [1, 2, 3]], 4, [2])
    assert got[0] == [100, 2] and got[2] == [102, 2]
    assert isinstance(got[1], SkipConversation) and got[1].reason == GENERATE_ERROR


def test_engine_args_name_the_targets_weights_dtype_and_parallelism():
    cfg = load_config("qwen3-8b", ["data.generate_backend=vllm", "data.vllm_tensor_parallel=2"])
    assert vllm_rows.model_source(cfg.target) == "Qwen/Qwen3-8B"

    class Config:
        architectures = ["Qwen3ForCausalLM"]

    kw = vllm_rows.engine_kwargs(cfg.target, Config, 8192, cfg.data.vllm_tensor_parallel)
    assert kw == {"dtype": "bfloat16", "max_model_len": 8192, "tensor_parallel_size": 2, "seed": 0}
    small = load_config("smollm2-135m").target
    assert vllm_rows.model_source(small) == str(assets.smollm2_dir())
    # the GGUF-converted SmolLM2 config names no architecture: vLLM is told the Llama one
    assert vllm_rows.engine_kwargs(small, object(), 1024)["hf_overrides"] == {"architectures": ["LlamaForCausalLM"]}


def test_ray_data_llm_processor_config_takes_our_fields():
    pytest.importorskip("ray.data.llm")  # in .venv: Ray 2.60's real config class (pydantic; no vllm needed)
    cfg = load_config("smollm2-135m", ["data.generate_backend=vllm", "data.num_actors=4", "data.batch_size=64"])
    pc = vllm_processor.processor_config(cfg, object(), 1024)
    assert (pc.model_source, pc.batch_size, pc.concurrency, pc.should_continue_on_error) == (
        str(assets.smollm2_dir()), 64, 4, True)
    assert pc.engine_kwargs["tensor_parallel_size"] == 1 and pc.engine_kwargs["max_model_len"] == 1024
    assert pc.chat_template_stage is False and pc.tokenize_stage is False and pc.detokenize_stage is False


def test_vllm_rows_imports_neither_ray_nor_vllm():
    # it runs under .venv-vllm (no Ray) in the offline check, and in Ray workers without importing the engine
    src = (ROOT / "lilicorr/platform/regenerate/vllm_rows.py").read_text()
    assert not re.search(r"^\s*(import|from)\s+(ray|vllm|torch)\b", src, re.M)


# ----------------------------------------------------------------------------- config


def test_config_refuses_what_the_vllm_backend_cannot_do_naming_the_fix():
    assert load_config("smollm2-135m", ["data.generate_backend=vllm"]).data.generate_backend == "vllm"
    with pytest.raises(ConfigError, match="target.source=random has neither: set target.source="):
        load_config("tiny-random", ["data.generate_backend=vllm"])
    with pytest.raises(ConfigError, match="drop data.use_gpu=false"):
        load_config("smollm2-135m", ["data.generate_backend=vllm", "data.use_gpu=false"])
    with pytest.raises(ConfigError, match="data.vllm_tensor_parallel=0 must be at least 1"):
        load_config("smollm2-135m", ["data.vllm_tensor_parallel=0"])


def test_preflight_names_pip_install_vllm_when_it_does_not_import(monkeypatch):
    cfg = load_config("smollm2-135m", ["data.generate_backend=vllm"])
    monkeypatch.setattr(vllm_processor, "_spec", lambda name: None if name == "vllm" else object())
    with pytest.raises(ConfigError, match=r"needs vllm importable in the job's environment: pip install vllm on the "
                                          r"GPU nodes"):
        vllm_processor.preflight(cfg)
    with pytest.raises(ConfigError, match="pip install vllm"):
        run_regeneration(cfg)  # before Ray or the output folder


# ----------------------------------------------------------------------------- the vllm path, our engine inside


def U(t):
    return {"role": "user", "content": t}


def A(t):
    return {"role": "assistant", "content": t}


ROWS = [
    {"id": "o1", "messages": [U("Tell me about cats"), A("x"), U("And dogs?"), A("y")]},
    "not json",  # malformed
    {"id": "o3", "messages": [{"role": "system", "content": "Answer briefly."}, U("What is 2+2?"), A("4")]},
    {"id": "o4", "messages": [U("Name a river"), A("Nile"), U("Which sea?"), A("x")]},  # its 2nd request fails
    {"id": "o5", "messages": [U("Write a haiku"), A("...")]},  # comes back empty
    {"id": "o6", "messages": [U("Translate 'cat' to French"), A("chat")]},
]


class EngineAsVLLM:
    """Stands in for a Ray Data LLM pass: each request row goes through vllm_rows.preprocess, our engine backend
    generates from its tokenized_prompt with its sampling params, and vllm_rows.output_row shapes the answer as
    the vLLM stage would; requests whose prompt holds `fail` / `empty` come back failed / without a token."""

    def __init__(self, model, tok, cfg, fail=None, empty=None):
        self.engine, self.tok, self.fail, self.empty, self.calls = GreedyGenerator(model, tok, cfg), tok, fail, empty, 0

    def __call__(self, requests):
        self.calls += 1
        reqs = [vllm_rows.preprocess(r) for r in requests]
        sp = reqs[0]["sampling_params"]
        gens = self.engine([r["tokenized_prompt"] for r in reqs], sp["max_tokens"], sp["stop_token_ids"])
        rows = []
        for r, g in zip(reqs, gens):
            text = self.tok.decode(r["tokenized_prompt"])
            row = vllm_rows.output_row(r, FakeRequestOutput(r["tokenized_prompt"], [FakeCompletion(
                [] if self.empty and self.empty in text else g)]))
            if self.fail and self.fail in text:
                row[vllm_rows.ERROR] = "EngineGenerateError: simulated"
            rows.append(row)
        return rows[::-1]  # Ray Data LLM's order is not the request order


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("vllm-regen") / "chats.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in ROWS))
    cfg = _cfg(path, tmp_path_factory.mktemp("unused"))
    model, tok = assets.load_target(cfg.target)
    return path, model, tok


def _cfg(source, out, backend="engine"):
    cfg = load_config("tiny-random", TARGET + [f"data.source={source}", f"data.output_dir={out}",
                                               "data.rows_per_shard=2", "data.batch_size=4", "data.max_new_tokens=10",
                                               "data.heldout_fraction=0.3", "data.vllm_wave_shards=2"])
    # set after load_config: its rule refuses vllm on a random target (vLLM loads weights from disk), and here the
    # in-memory random target is exactly what our engine, standing in for vLLM, generates with
    cfg.data.generate_backend = backend
    return cfg


def _engine_rows(cfg, tok, model):
    """What the engine backend's actor computes: regenerate_rows over every shard with a GreedyGenerator."""
    src = resolve_source(cfg.data.source)
    rows = [r for t in plan_shards(src, len(ROWS), cfg.data.rows_per_shard)
            for r in read_shard_rows(dataclasses.asdict(t), src=src, heldout_fraction=cfg.data.heldout_fraction)]
    return regenerate_rows(rows, tok, GreedyGenerator(model, tok, cfg), regen_settings(cfg, model.config, tok))


def _written(out):
    rows = [r for split in ("train", "heldout") for r in read_split(str(out), split).to_pylist()]
    return sorted(rows, key=lambda r: r["row_index"])


KEYS = ("row_index", "id", "messages", "input_ids", "loss_mask", "num_assistant_turns", "generated_tokens",
        "turns_capped")


def _run_vllm(monkeypatch, cfg, fake, **kw):
    monkeypatch.setattr(vllm_processor, "preflight", lambda cfg: None)  # no vllm in .venv: the fake needs none
    monkeypatch.setattr(vllm_processor, "RayLLMRun", lambda cfg, hf_config, max_model_len: fake)
    return run_regeneration(cfg, **kw)


def test_vllm_path_writes_the_engine_backends_rows_and_counts_bad_ones(setup, tmp_path, monkeypatch):
    source, model, tok = setup
    cfg = _cfg(source, tmp_path, "vllm")
    fake = EngineAsVLLM(model, tok, cfg, fail="Which sea?", empty="Write a haiku")
    result = _run_vllm(monkeypatch, cfg, fake)
    want = {r["id"]: r for r in _engine_rows(cfg, tok, model) if not r["skip_reason"]}
    got = _written(tmp_path)
    assert [r["id"] for r in got] == ["o1", "o3", "o6"]  # o4 failed on its 2nd turn, o5 came back empty
    for r in got:  # same prompts, answers, token ids and loss masks as the engine backend's
        assert {k: r[k] for k in KEYS} == {k: want[r["id"]][k] for k in KEYS}, r["id"]
    c = result["corpus"]
    assert c["rows_in"] == 6 and c["skipped"] == {"empty_generation": 1, "generate_error": 1, "malformed": 1}
    (message, n), = c["generate_errors"].items()
    assert n == 1 and "vLLM request failed: EngineGenerateError: simulated" in message
    # two waves of 2 shards (6 rows / 2 per shard = 3 shards); a wave's pass per turn of its longest conversation
    assert fake.calls == 2 + 1


def test_vllm_path_resumes_a_killed_run_skipping_written_shards(setup, tmp_path, monkeypatch):
    source, model, tok = setup
    cfg = _cfg(source, tmp_path, "vllm")
    cfg.data.vllm_wave_shards = 1

    def crash(shard, counts):
        raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError, match="simulated crash"):
        _run_vllm(monkeypatch, cfg, EngineAsVLLM(model, tok, cfg), on_shard_done=crash)
    assert sorted(json.loads((tmp_path / "manifest.json").read_text())["shards"]) == ["0"]
    fake = EngineAsVLLM(model, tok, cfg)
    resumed = _run_vllm(monkeypatch, cfg, fake)
    assert resumed["this_run"]["shards"] == 2 and resumed["corpus"]["shards"] == 3
    want = [r for r in _engine_rows(cfg, tok, model) if not r["skip_reason"]]
    assert [{k: r[k] for k in KEYS} for r in _written(tmp_path)] == [{k: r[k] for k in KEYS} for r in want]
    assert resumed["corpus"]["skipped"] == {"malformed": 1}
    assert _run_vllm(monkeypatch, cfg, fake)["this_run"]["shards"] == 0  # nothing left to do
