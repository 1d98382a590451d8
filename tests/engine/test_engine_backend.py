"""engine.backend (engine/backend.py): the implementation of each computation chosen once per decoder, applied,
recorded, and refused with a fix when engine.backend=fast asks for one that cannot run here."""

import pytest
import torch
from engine_helpers import tiny_config, varied_random_target

from lilicorr.config import ConfigError, load_config
from lilicorr.engine import backend
from lilicorr.engine.requests import Request
from lilicorr.engine.systems import build_decoder

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model():
    return varied_random_target(tiny_config("llama"))


def _decode(model, system, overrides=()):
    dec = build_decoder(tiny_config("llama", overrides=list(overrides)), model, system, max_batch=1)
    out = dec.generate([Request(0, [5, 7, 11, 13, 17], max_new_tokens=10)])[0].output_ids
    return dec, list(out)


def test_auto_records_and_applies_the_levers_paths(model):
    dec, _ = _decode(model, "lilicorr", ["engine.cpu_prepack=false", "engine.cpu_native_head=false"])
    plan = dec.backend_plan
    rec = plan.record()
    assert rec["backend"] == "auto" and rec["device"] == "cpu float32"
    assert rec["target_steps"] == backend.SCRIPTED_STACK and rec["linear"] == backend.TORCH
    assert rec["target_one_row"] == backend.SCRIPTED_STACK and rec["lm_head"] == backend.TORCH
    assert rec["head"] == backend.MODULES and rec["drafter"] == "scripted float32"
    assert rec["cuda_graphs"] == "off" and rec["notes"] == ""
    t = dec.target  # the plan is what the decoder runs
    assert t.script_layers and not t.prepack
    fast = dec.runner.drafting.head_options["fast"]
    assert not fast.native and dec.runner.drafting.drafter_fast is not None
    dec, _ = _decode(model, "lilicorr")
    assert dec.backend_plan.head == "native-c (1 row), modules (2+ rows)"
    assert dec.backend_plan.lm_head == "torch (1 row), onednn-packed (2+ rows)"
    assert dec.runner.drafting.head_options["fast"].native


def test_auto_falls_back_with_a_note_and_fast_refuses_with_the_fix(model, monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)  # a PyTorch without oneDNN
    dec, _ = _decode(model, "ar")
    plan = dec.backend_plan
    assert plan.linear == backend.TORCH and not dec.target.prepack
    assert "projections" in plan.record()["notes"] and "no oneDNN" in plan.record()["notes"]
    with pytest.raises(backend.BackendUnavailable) as e:
        _decode(model, "ar", ["engine.backend=fast"])
    msg = str(e.value)
    assert "onednn-packed" in msg and "no oneDNN" in msg
    assert "engine.cpu_prepack=false" in msg and "engine.backend=auto" in msg  # the two fixes


def test_fast_refuses_a_head_path_that_cannot_run(model, monkeypatch):
    from lilicorr.models.heads import lilicorr_native

    monkeypatch.setattr(lilicorr_native, "available", lambda: False)
    with pytest.raises(backend.BackendUnavailable, match="engine.cpu_native_head=false"):
        _decode(model, "lilicorr", ["engine.backend=fast"])
    dec, _ = _decode(model, "lilicorr")
    assert dec.backend_plan.head == backend.MODULES and "native-c" in dec.backend_plan.record()["notes"]


def test_reference_runs_the_references_and_decodes_the_same_tokens(model, monkeypatch):
    from lilicorr.models import drafter_fast

    _, ar = _decode(model, "ar")
    calls = []
    monkeypatch.setattr(drafter_fast, "block", lambda *a: calls.append(a))  # the scripted drafter must not run
    for system in ("lilicorr", "ddtree"):
        dec, out = _decode(model, system, ["engine.backend=reference"])
        plan = dec.backend_plan
        assert (plan.target_steps, plan.target_one_row, plan.linear) == (backend.EAGER_LAYERS,) * 2 + (backend.TORCH,)
        assert plan.drafter == "modules float32" and not dec.target.script_layers and not dec.target.prepack
        assert plan.head == backend.MODULES and plan.notes == ()
        assert out == ar  # greedy decoding is lossless on the references too
    assert plan.tree == "eager" and calls == []


def test_backend_is_a_checked_config_choice():
    assert load_config("tiny-random", ["engine.backend=reference"]).engine.backend == "reference"
    with pytest.raises(ConfigError, match="engine.backend"):
        load_config("tiny-random", ["engine.backend=fastest"])


def test_plan_names_the_cuda_paths_without_a_gpu():
    cfg = load_config("tiny-random", ["engine.use_triton=false"]).engine
    plan = backend.resolve(cfg, torch.device("cuda"), torch.bfloat16)
    assert plan.cuda_graphs == backend.GRAPHED and plan.kernels == backend.TORCH
    assert (plan.target_steps, plan.linear) == (backend.EAGER_LAYERS, backend.TORCH)


def test_a_second_decoder_leaves_the_first_as_it_was(model, monkeypatch):
    """Each decoder's choices are its own (item 3 of issue 40): building and running another decoder over the same
    target, with other paths (the references, no C head, no Triton), changes neither the first's head paths, its
    tables, its Triton switch nor its output."""
    from lilicorr.engine import scheduler
    from lilicorr.kernels import dispatch

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # Triton could run on CPU tensors: the switch is what decides
    seen = []
    real = scheduler.Decoder._admit
    monkeypatch.setattr(scheduler.Decoder, "_admit",
                        lambda self: seen.append((id(self), dispatch.use_triton(torch.zeros(1)))) or real(self))
    first, out = _decode(model, "lilicorr")
    fast = first.runner.drafting.head_options["fast"]
    assert fast.native and fast.native_plan is not None and first.backend_plan.kernels == backend.TRITON
    plan, native_plan, head_keys = first.backend_plan, fast.native_plan, set(first.runner.drafting.head.__dict__)
    second, _ = _decode(model, "lilicorr", ["engine.backend=reference", "engine.cpu_native_head=false",
                                             "engine.use_triton=false"])
    assert not second.runner.drafting.head_options["fast"].native
    assert {t for d, t in seen if d == id(second)} == {False}
    again = first.generate([Request(1, [5, 7, 11, 13, 17], max_new_tokens=10)])[0].output_ids
    assert list(again) == out and first.backend_plan is plan and fast.native_plan is native_plan
    assert set(first.runner.drafting.head.__dict__) == head_keys
    assert {t for d, t in seen if d == id(first)} == {dispatch.triton_available()}


def test_one_row_projections_follow_engine_cpu_one_row(model, monkeypatch):
    """engine.cpu_one_row: "plain" keeps F.linear at one row, "packed" takes the packed copies, "measure" takes the
    faster of the two as timed on the target's weights, once per target; output equals AR's on every path."""
    from lilicorr.kernels import linear, packed_linear

    monkeypatch.setattr(packed_linear, "MIN_ELEMENTS", 0)  # the tiny target's weights pack like SmolLM2's
    monkeypatch.setattr(backend, "_ONE_ROW_MEASURED", {})
    timings = []
    monkeypatch.setattr(linear, "time_one_row", lambda weights: timings.append(len(weights)) or (2e-3, 1e-3, 7))
    _, ar = _decode(model, "ar", ["engine.backend=reference"])

    def one_row_packed(dec):
        t = dec.target
        return [p.packed_for(1) is not None for w in t.layers for p in (w.qkv, w.o, w.gate_up, w.down)] + [
            t.lm_head_proj.packed_for(1) is not None]

    for choice, path in (("plain", backend.TORCH), ("packed", backend.PACKED), ("measure", backend.PACKED)):
        for system in ("ar", "lilicorr"):
            dec, out = _decode(model, system, [f"engine.cpu_one_row={choice}"])
            plan = dec.backend_plan
            assert plan.one_row_linear == path and plan.one_row_packed == (path == backend.PACKED)
            assert set(one_row_packed(dec)) == {path == backend.PACKED}
            assert plan.lm_head == (backend.PACKED if path == backend.PACKED
                                    else "torch (1 row), onednn-packed (2+ rows)")
            assert out == ar
    # measured once for this target, with its LM head and first layer's projections, and the figures recorded
    assert timings == [1 + 7]  # LM head + q, k, v, o, gate, up, down
    assert plan.record()["one_row_linear"] == "onednn-packed"
    assert plan.record()["one_row_measured"] == "packed 1.00 ms, torch 2.00 ms a row through 7 weights"
    monkeypatch.setattr(backend, "_ONE_ROW_MEASURED", {})
    monkeypatch.setattr(linear, "time_one_row", lambda weights: (1e-3, 2e-3, 7))  # plain faster: F.linear
    dec, _ = _decode(model, "ar")
    plan = dec.backend_plan
    assert (plan.one_row_linear, plan.one_row_measured) == (backend.TORCH, "packed 2.00 ms, torch 1.00 ms a row "
                                                            "through 7 weights") and not any(one_row_packed(dec))
    for overrides in (["engine.cpu_prepack=false", "engine.cpu_one_row=packed"],
                      ["engine.backend=reference", "engine.cpu_one_row=packed"]):  # no packed copies: F.linear
        dec, _ = _decode(model, "ar", overrides)
        assert dec.backend_plan.one_row_linear == backend.TORCH and not any(one_row_packed(dec))
    with pytest.raises(ConfigError, match="engine.cpu_one_row"):
        load_config("tiny-random", ["engine.cpu_one_row=fastest"])


def test_time_one_row_times_the_packable_weights():
    from lilicorr.kernels.linear import time_one_row

    big, small = torch.randn(1024, 256), torch.randn(8, 8)  # MIN_ELEMENTS and below
    plain, packed, timed = time_one_row([big, small], repeats=3)
    assert timed == 1 and plain > 0 and packed > 0
    assert time_one_row([small]) == (0.0, 0.0, 0)
