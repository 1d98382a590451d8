"""What a server needs from the decoder: deltas, abort, a bounded queue, prefill that does not stall
running rows, per-request sampling settings, failure isolation, warm-up. Tiny random target, CPU."""

import pytest
import torch

from engine_helpers import tiny_config, varied_random_target
from lilicorr.engine.requests import QueueFull, Request, RequestError
from lilicorr.engine.systems import build_decoder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MAX_NEW = 10
LENGTHS = [6, 3, 11, 2, 8]


@pytest.fixture(scope="module")
def setup():
    cfg = tiny_config("llama")
    model = varied_random_target(cfg, seed=11)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, cfg.target.vocab_size, (n,), generator=g).tolist() for n in LENGTHS]
    refs = []
    for p in prompts:
        out = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
        refs.append(out[0, len(p):].tolist())
    return model, prompts, refs


def decoder(model, system="dflash", max_batch=2, overrides=()):
    cfg = tiny_config("llama", overrides=list(overrides))
    return build_decoder(cfg, model, system, max_batch=max_batch)


def drain(dec, limit=500):
    """Run steps until idle: {id: concatenated new_ids}, {id: final Delta}, steps."""
    got, final = {}, {}
    for n in range(limit):
        if not dec.has_work():
            return got, final, n
        for d in dec.step_deltas():
            assert d.id not in final, f"delta for {d.id} after its final one"
            got.setdefault(d.id, []).extend(d.new_ids)
            if d.finished:
                final[d.id] = d
    raise AssertionError("decoder did not finish")


@pytest.mark.parametrize("system", ["ar", "dflash"])
def test_deltas_concatenate_to_generate_and_transformers_greedy(setup, system):
    model, prompts, refs = setup
    dec = decoder(model, system, max_batch=2, overrides=["engine.prefill_token_budget=4"])
    for i, p in enumerate(prompts):  # more requests than slots; prompts longer than one step's budget
        dec.add_request(Request(i, p, max_new_tokens=MAX_NEW))
    got, final, _ = drain(dec)
    assert [got[i] for i in range(len(prompts))] == refs
    assert all(final[i].result.output_ids == refs[i] and final[i].finish_reason == "length" for i in final)
    again = decoder(model, system, max_batch=3).generate([Request(i, p, max_new_tokens=MAX_NEW)
                                                          for i, p in enumerate(prompts)])
    assert [r.output_ids for r in again] == refs


def test_prefill_budget_does_not_stall_running_rows(setup):
    """A 40-token prompt at a budget of 4 tokens per step takes 10 steps; the running row gains
    tokens in every one of them."""
    model, prompts, refs = setup
    dec = decoder(model, "ar", max_batch=2, overrides=["engine.prefill_token_budget=4"])
    dec.add_request(Request("run", prompts[1], max_new_tokens=30))
    dec.step_deltas()  # prefilled (3 tokens) + first block
    long_prompt = (prompts[0] * 7)[:40]
    dec.add_request(Request("long", long_prompt, max_new_tokens=2))
    for _ in range(9):
        ds = {d.id: d for d in dec.step_deltas()}
        assert len(ds["run"].new_ids) == 1 and "long" not in ds
    ds = {d.id: d for d in dec.step_deltas()}
    assert "long" in ds and len(ds["run"].new_ids) == 1


def test_abort_frees_the_slot_for_a_waiting_request(setup):
    model, prompts, refs = setup
    dec = decoder(model, "dflash", max_batch=1)
    dec.add_request(Request("a", prompts[0], max_new_tokens=MAX_NEW))
    dec.add_request(Request("b", prompts[1], max_new_tokens=MAX_NEW))
    dec.add_request(Request("c", prompts[2], max_new_tokens=MAX_NEW))
    first = dec.step_deltas()
    assert [d.id for d in first] == ["a"] and dec.num_waiting() == 2
    assert dec.abort("c") and dec.abort("a")  # one waiting, one running
    assert not dec.abort("a") and not dec.abort("nobody")
    assert dec.num_running() == 0
    got, final, _ = drain(dec)
    assert final["a"].finish_reason == "abort" and final["a"].result.output_ids == first[0].new_ids
    assert final["c"].finish_reason == "abort" and final["c"].result.output_ids == []
    assert got["b"] == refs[1] and final["b"].finish_reason == "length"


def test_queue_full_is_refused_and_clears(setup):
    model, prompts, _ = setup
    dec = decoder(model, "ar", max_batch=1, overrides=["engine.max_waiting=2"])
    dec.add_request(Request(0, prompts[0]))
    dec.add_request(Request(1, prompts[1]))
    with pytest.raises(QueueFull, match="max_waiting=2"):
        dec.add_request(Request(2, prompts[2]))
    dec.step_deltas()  # request 0 takes the slot
    dec.add_request(Request(2, prompts[2]))
    with pytest.raises(RequestError, match="top_p"):
        dec.validate(Request(3, prompts[0], top_p=0.0))
    with pytest.raises(RequestError, match="empty prompt"):
        dec.validate(Request(4, []))
    with pytest.raises(RequestError, match="integer token ids"):
        dec.validate(Request(5, ["a", 1]))


def test_per_request_temperature_in_one_batch(setup):
    """A greedy row and sampled rows at different temperatures share a batch: the greedy row is the
    target's greedy output, and each sampled row equals the same request run alone (its own seed)."""
    model, prompts, refs = setup
    reqs = [Request("greedy", prompts[0], max_new_tokens=MAX_NEW, temperature=0.0),
            Request("hot", prompts[0], max_new_tokens=MAX_NEW, temperature=1.5, seed=3),
            Request("warm", prompts[0], max_new_tokens=MAX_NEW, temperature=0.7, seed=3, top_k=5, top_p=0.8)]
    for system in ["dflash", "dspark-sampled"]:
        mixed = decoder(model, system, max_batch=3).generate(reqs)
        assert mixed[0].output_ids == refs[0]
        assert mixed[1].output_ids != refs[0]
        if system == "dflash":  # deterministic proposals: a row's output depends on its seed only
            for i in (1, 2):
                alone = decoder(model, system, max_batch=1).generate([reqs[i]])[0]
                assert alone.output_ids == mixed[i].output_ids


def test_a_failing_request_fails_alone(setup, monkeypatch):
    """A fault injected into blocks that contain one request's row: that request ends with an error,
    the others still equal the target's greedy output; a prefill fault likewise."""
    model, prompts, refs = setup
    dec = decoder(model, "dflash", max_batch=3)
    inner = dec.runner.verify

    def verify(rows, *a, **kw):
        for s in range(rows.start, rows.stop):
            live = dec.slots[s]
            if live is not None and live.request.id == 1 and len(live.result.output_ids) >= 3:
                raise RuntimeError("injected fault")
        return inner(rows, *a, **kw)

    monkeypatch.setattr(dec.runner, "verify", verify)
    inner_prefill = dec.runner.prefill

    def prefill(slots, chunks, starts, finals):
        if any(list(c) == prompts[3] for c in chunks):
            raise ValueError("injected prefill fault")
        return inner_prefill(slots, chunks, starts, finals)

    monkeypatch.setattr(dec.runner, "prefill", prefill)
    res = dec.generate([Request(i, p, max_new_tokens=MAX_NEW) for i, p in enumerate(prompts)])
    for i, r in enumerate(res):
        if i in (1, 3):
            assert r.finish_reason == "error" and "injected" in r.error and r.output_ids == refs[i][:len(r.output_ids)]
        else:
            assert r.output_ids == refs[i] and r.error is None
    assert dec.num_running() == 0 and not dec.has_work()


def test_warmup_leaves_a_fresh_decoder(setup):
    model, prompts, refs = setup
    dec = decoder(model, "lilicorr", max_batch=2)
    dec.warmup()
    assert dec.stats.blocks == 0 and not dec.has_work()
    res = dec.generate([Request(i, p, max_new_tokens=MAX_NEW) for i, p in enumerate(prompts)])
    assert [r.output_ids for r in res] == refs
    assert dec.stats.blocks == sum(r.blocks for r in res)
    dec.add_request(Request("x", prompts[0]))
    with pytest.raises(RuntimeError, match="idle"):
        dec.warmup()
