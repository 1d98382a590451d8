"""EngineThread: a daemon thread runs the step loop; two threads submit concurrently, one aborts."""

import threading
import time

import pytest
import torch

from engine_helpers import tiny_config, varied_random_target
from lilicorr.engine.requests import QueueFull, Request, RequestError
from lilicorr.engine.systems import build_decoder
from lilicorr.engine.threaded import EngineThread

MAX_NEW = 10


@pytest.fixture(scope="module")
def setup():
    cfg = tiny_config("llama", overrides=["engine.max_waiting=4"])
    model = varied_random_target(cfg, seed=11)
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, cfg.target.vocab_size, (n,), generator=g).tolist() for n in [5, 2, 9, 4, 7, 3]]
    refs = [model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None,
                           pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    return cfg, model, prompts, refs


class Collector:
    def __init__(self):
        self.ids, self.final, self.done, self.threads = {}, {}, {}, set()

    def callback(self, rid):
        self.done[rid] = threading.Event()

        def on_delta(d):
            assert d.id == rid and rid not in self.final
            self.threads.add(threading.current_thread().name)
            self.ids.setdefault(rid, []).extend(d.new_ids)
            if d.finished:
                self.final[rid] = d
                self.done[rid].set()
        return on_delta


def count_steps(dec):
    inner, dec.steps_taken = dec.step_deltas, 0

    def counted():
        dec.steps_taken += 1
        return inner()
    dec.step_deltas = counted


def steps_taken(dec):
    return dec.steps_taken


def test_two_concurrent_submitters_abort_and_health(setup):
    cfg, model, prompts, refs = setup
    dec = build_decoder(cfg, model, "dflash", max_batch=2)
    count_steps(dec)
    et = EngineThread(dec).start()
    col = Collector()
    errors = []

    def submitter(ids):
        for i in ids:
            for _ in range(200):
                try:
                    et.submit(Request(i, prompts[i], max_new_tokens=MAX_NEW), col.callback(i))
                    break
                except QueueFull:  # a full queue is refused synchronously: retry, as a client would
                    time.sleep(0.01)
            else:
                errors.append(f"request {i} never admitted")

    workers = [threading.Thread(target=submitter, args=(ids,)) for ids in ([0, 2, 4], [1, 3, 5])]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert not errors
    for i in range(len(prompts)):
        assert col.done[i].wait(60), f"request {i} did not finish"
    assert [col.ids[i] for i in range(len(prompts))] == refs
    assert all(col.final[i].result.output_ids == refs[i] for i in range(len(prompts)))
    assert col.threads == {"lilicorr-engine"}  # callbacks run on the engine thread

    with pytest.raises(RequestError, match="empty prompt"):
        et.submit(Request("bad", []), lambda d: None)
    long = Request("long", prompts[2], max_new_tokens=400)
    et.submit(long, col.callback("long"))
    with pytest.raises(RequestError, match="already in flight"):
        et.submit(Request("long", prompts[0]), lambda d: None)
    while "long" not in col.ids:
        time.sleep(0.01)
    assert et.abort("long") and not et.abort("nobody")
    assert col.done["long"].wait(30) and col.final["long"].finish_reason == "abort"
    assert len(col.ids["long"]) < 400 and dec.num_running() == 0

    assert et.alive and not et.stalled(5.0)
    steps = steps_taken(dec)
    time.sleep(0.5)  # idle: the loop sleeps on its condition and runs no steps
    assert steps_taken(dec) == steps
    et.stop()
    assert not et.alive and et.stalled(5.0)
    with pytest.raises(RuntimeError, match="not running"):
        et.submit(Request("late", prompts[0]), lambda d: None)


def test_callback_errors_and_step_failures_do_not_kill_the_loop(setup):
    cfg, model, prompts, refs = setup
    dec = build_decoder(cfg, model, "ar", max_batch=2)
    et = EngineThread(dec).start()
    col = Collector()

    def bad_callback(d):
        raise ValueError("client bug")

    et.submit(Request("x", prompts[0], max_new_tokens=MAX_NEW), bad_callback)
    et.submit(Request(1, prompts[1], max_new_tokens=MAX_NEW), col.callback(1))
    assert col.done[1].wait(30) and col.ids[1] == refs[1]

    inner = dec.step_deltas
    calls = {"n": 0}

    def broken_once():
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("scheduler bug")
        return inner()

    dec.step_deltas = broken_once
    et.submit(Request(2, prompts[2], max_new_tokens=MAX_NEW), col.callback(2))
    assert col.done[2].wait(30) and col.final[2].finish_reason == "error" and "scheduler bug" in col.final[2].result.error
    et.submit(Request(3, prompts[3], max_new_tokens=MAX_NEW), col.callback(3))
    assert col.done[3].wait(30) and col.ids[3] == refs[3] and et.alive
    et.stop()


def test_torch_thread_runs_every_engines_steps_on_one_thread(setup):
    """Two engines sharing a TorchThread: every step of both runs on that one thread, at its intra-op thread
    count (the caller's own count untouched), outputs still the target's greedy ones; an exception raised
    there reaches the caller."""
    from lilicorr.engine.threaded import TorchThread

    cfg, model, prompts, refs = setup
    before = torch.get_num_threads()
    tt = TorchThread(1)
    assert tt.run(torch.get_num_threads) == 1 and torch.get_num_threads() == before
    with pytest.raises(ValueError):
        tt.run(int, "not a number")
    seen, engines = [], []
    for system in ("ar", "dflash"):
        dec = build_decoder(cfg, model, system, max_batch=2)
        inner = dec.step_deltas

        def recorded(inner=inner):
            seen.append((threading.get_ident(), torch.get_num_threads()))
            return inner()
        dec.step_deltas = recorded
        engines.append(EngineThread(dec, torch_thread=tt).start())
    col = Collector()
    for k, et in enumerate(engines):
        et.submit(Request(k, prompts[k], max_new_tokens=MAX_NEW), col.callback(k))
    for k in range(len(engines)):
        assert col.done[k].wait(60)
        assert col.ids[k] == refs[k]
    for et in engines:
        et.stop()
    torch_ident = tt.run(threading.get_ident)
    assert seen and set(seen) == {(torch_ident, 1)} and torch_ident != threading.get_ident()
