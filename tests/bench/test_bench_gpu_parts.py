"""The GPU script's parts that decide whether its figures are true, checked on CPU."""

import json
import warnings
from types import SimpleNamespace

import pytest
import torch

from lilicorr.config import load_config
from lilicorr.bench import gpu_decode as mg
from lilicorr.bench import kernels as kb


def test_json_is_rewritten_after_every_section(tmp_path):
    out = tmp_path / "gpu.json"
    r = mg.Run(600.0, str(out))
    r.section("one", 0, lambda: {"a": 1})
    assert json.loads(out.read_text())["a"] == 1  # there before the next section starts

    def boom():
        raise ValueError("broken")

    r.section("two", 0, boom)
    res = json.loads(out.read_text())
    assert res["two_error"] == "ValueError: broken" and res["failed_sections"] == ["two"]
    assert set(res["section_s"]) == {"one", "two"}
    r.section("three", 1e9, lambda: {"b": 2})  # past the time limit: recorded as skipped, file rewritten
    res = json.loads(out.read_text())
    assert "three_skipped" in res and "b" not in res


def test_modules_built_on_device_take_the_device_and_dtype_at_creation():
    from lilicorr.models.target import build_random_target

    cfg = load_config("tiny-random", mg.TINY)
    before = torch.get_default_dtype()
    with mg.on_device("meta", torch.bfloat16):  # built on the CPU and moved, it would not be on meta
        model = build_random_target(cfg.target)
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert torch.get_default_dtype() == before


def test_teacher_forced_decode_feeds_the_given_tokens():
    from lilicorr.engine.target_forward import TargetForward

    cfg = load_config("tiny-random", [*mg.TINY, "target.dtype=float32"])
    model = mg.build_target(cfg.target, torch.device("cpu"))
    tf = TargetForward(model)
    cache = tf.new_cache(1, 64)
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 512, (1, 10), generator=g)
    feed = torch.randint(0, 512, (1, 7), generator=g)  # random tokens: nothing like the model's own argmax
    preds, _ = mg._decode(tf, cache, prompt, 8, None, feed)
    with torch.no_grad():
        ref = model(torch.cat([prompt, feed], 1)).logits[0, 9:].argmax(-1).tolist()
    assert preds == ref
    free, _ = mg._decode(tf, cache, prompt, 8)
    assert free != preds  # free-running differs: the feed was really used


def test_engine_graph_state_reports_the_eager_fallback():
    from lilicorr.engine.cuda_graphs import _Graph

    def dec(verify):
        graphs = None if verify is None else SimpleNamespace(_verify=verify)
        return SimpleNamespace(runner=SimpleNamespace(graphs=graphs))

    assert mg.engine_graph_state(dec(None), [])[0] is None
    fell = _Graph(lambda: None, capture=False)  # the state a failed capture leaves: failed, no graph
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("CUDA graph capture failed, running eagerly: boom")
    ok, note = mg.engine_graph_state(dec(fell), caught)
    assert ok is False and "boom" in note
    good = _Graph(lambda: None)
    good.graph = object()
    assert mg.engine_graph_state(dec(good), [])[0] is True
    assert mg.engine_graph_state(dec(_Graph(lambda: None)), [])[0] is False  # never captured: not "captured"


def test_kernel_bench_captures_only_triton_rows_and_stops_after_a_failed_capture(monkeypatch):
    calls = []

    def fake_time(fns, device, iters, graph=False):
        calls.append((fns[0].__name__, graph))
        if graph and fns[0].__name__ == "bad":
            raise RuntimeError("capture failed")
        return 10.0

    def bad():
        pass

    def good():
        pass

    def ref():
        pass

    monkeypatch.setattr(kb, "time_calls", fake_time)
    monkeypatch.setattr(kb, "CAPTURE_FAILED", [])
    dev = torch.device("cuda")  # only compared by type: nothing runs on it
    kb._measure("eager reference", ref, lambda f: [f], dev, 1, 1, 1.0, True)
    assert calls == [("ref", False)]
    rows = kb._measure("triton", bad, lambda f: [f], dev, 1, 1, 1.0, True)
    assert rows[1]["note"].startswith("failed") and len(kb.CAPTURE_FAILED) == 1
    rows = kb._measure("triton fused", good, lambda f: [f], dev, 1, 1, 1.0, True)
    assert ("good", True) not in calls and rows[1]["note"].startswith("not captured")
    assert "us" in rows[0]  # the un-graphed row still timed


def test_hf_peer_warms_up_with_the_same_call_and_times_after_the_prefill(monkeypatch):
    from lilicorr.bench.hf_peer import hf_decode_tps

    cfg = load_config("tiny-random", [*mg.TINY, "target.dtype=float32"])
    model = mg.build_target(cfg.target, torch.device("cpu"))
    seen = []
    real = model.generate

    def spy(**kw):
        seen.append({k: (v.tolist() if torch.is_tensor(v) else v) for k, v in kw.items() if k != "streamer"})
        assert kw["streamer"] is not None
        return real(**kw)

    monkeypatch.setattr(model, "generate", spy)
    got = hf_decode_tps(model, list(range(5, 17)), 6, static=True)
    assert len(seen) == 2 and seen[0] == seen[1] and seen[0]["cache_implementation"] == "static"
    assert seen[0]["max_new_tokens"] == 6 and got["new_tokens"] == 6
    assert 0 < got["prefill_s"] < got["timed_call_s"] and got["tok_s"] > 0


@pytest.mark.parametrize("dry_run", [True, False])
def test_train_config_has_table4_settings(dry_run):
    from lilicorr.bench.gpu_train import train_config

    cfg = train_config("lilicorr", dry_run, layers=3)
    assert (cfg.drafter.block_size, cfg.head.top_k, cfg.head.kind, cfg.target.num_layers) == (16, 8, "lilicorr", 3)
    if not dry_run:
        assert (cfg.drafter.anchors_per_seq, cfg.train.seq_len, cfg.target.vocab_size) == (512, 3072, 151936)
        assert (cfg.target.hidden_size, cfg.target.dtype) == (4096, "bfloat16")


def test_graphed_target_step_raises_when_the_capture_fails():
    """The GPU bench times AR through the engine's graph wrapper (cuda_graphs.py), but where the engine would run
    eagerly after a failed capture, the bench must not time the eager forward: it raises (here: no CUDA)."""
    from lilicorr.engine.cuda_graphs import graphed_target_step
    from lilicorr.engine.target_forward import TargetForward

    cfg = load_config("tiny-random", [*mg.TINY, "target.dtype=float32"])
    tf = TargetForward(mg.build_target(cfg.target, torch.device("cpu")))
    cache = tf.new_cache(1, 32)
    with pytest.raises(RuntimeError, match="CUDA graph capture of a 16-token target step failed"):
        graphed_target_step(tf, cache, 16)
    assert int(cache.lens[0]) == 0  # nothing committed
