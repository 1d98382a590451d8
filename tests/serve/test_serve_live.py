"""A live Ray Serve app on 127.0.0.1 (tiny-random target, random drafter) driven by the official `openai` client.

Serve starts once for the module. Greedy output through HTTP, streamed and not, must equal what
`jobs/generate.py` writes for the same prompt and system (text, token count, blocks, accepted drafts);
more concurrent requests than engine slots all finish; a client that disconnects frees its slot.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
SLOTS = 2
OVERRIDES = [f"engine.max_batch_size={SLOTS}", "engine.max_waiting=16", "engine.max_seq_len=2048",
             "engine.max_new_tokens=24"]
SYSTEMS = ["lilicorr", "ar"]
MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]
PROMPT = "The quick brown fox"


def _generate_rows(system: str, tmp: Path) -> dict:
    """jobs/generate.py's rows for MESSAGES (id "chat") and PROMPT (id "text")."""
    spec = importlib.util.spec_from_file_location("generate_job", ROOT / "jobs" / "generate.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    prompts, out = tmp / f"{system}-in.jsonl", tmp / f"{system}-out.jsonl"
    prompts.write_text(json.dumps({"id": "chat", "messages": MESSAGES}) + "\n" + json.dumps({"id": "text", "prompt": PROMPT}))
    job.main(["--preset", "tiny-random", "--system", system, "--drafter", "random", "--temperature", "0",
              "--prompts", str(prompts), "--out", str(out), *OVERRIDES])
    return {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}


@pytest.fixture(scope="module")
def server(tmp_path_factory, one_torch_thread):
    from lilicorr.serve_apps.launch import free_port
    from lilicorr.serve_apps.launch import start_serve, stop_serve
    from lilicorr.serve_apps.loading import ServeSpec

    spec = ServeSpec(preset="tiny-random", overrides=OVERRIDES, systems=SYSTEMS, drafter="random",
                     api_key_env="LILICORR_TEST_NO_KEY", torch_threads=1)
    tmp = tmp_path_factory.mktemp("serve")
    with ThreadPoolExecutor(1) as pool:  # the reference runs while Ray and the replica start
        rows = pool.submit(lambda: {s: _generate_rows(s, tmp) for s in SYSTEMS})
        try:
            url = start_serve(spec, "127.0.0.1", free_port())
            yield url, rows.result()
        finally:
            stop_serve()


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0, timeout=120)


def _check(usage, text, row):
    assert text == row["text"]
    assert usage.completion_tokens == len(row["output_ids"])
    extra = usage.model_extra
    assert (extra["blocks"], extra["accepted_tokens"]) == (row["blocks"], row["accepted_tokens"])


@pytest.mark.parametrize("system", SYSTEMS)
def test_greedy_equals_generate_job(server, client, system):
    url, rows = server
    model = f"tiny-random-{system}"
    assert model in [m.id for m in client.models.list().data]
    r = client.chat.completions.create(model=model, messages=MESSAGES, temperature=0)
    _check(r.usage, r.choices[0].message.content, rows[system]["chat"])
    stream = client.chat.completions.create(model=model, messages=MESSAGES, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    _check(chunks[-1].usage, text, rows[system]["chat"])
    r = client.completions.create(model=model, prompt=PROMPT, temperature=0)
    _check(r.usage, r.choices[0].text, rows[system]["text"])


def test_more_requests_than_slots_all_finish(server):
    from openai import AsyncOpenAI

    url, rows = server

    async def go():
        async with AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
            calls = [c.completions.create(model="tiny-random-lilicorr", prompt=f"{PROMPT} {i}", max_tokens=12,
                                          temperature=0) for i in range(3 * SLOTS)]
            return await asyncio.gather(*calls)

    results = asyncio.run(go())
    assert len(results) == 3 * SLOTS
    for r in results:
        assert r.choices[0].finish_reason in ("stop", "length") and 1 <= r.usage.completion_tokens <= 12


def _load(url: str, model: str) -> dict:
    return httpx.get(f"{url}/health", timeout=10).json()["load"][model]


def test_disconnect_frees_the_slot(server):
    url, _ = server
    model = "tiny-random-ar"
    body = {"model": model, "prompt": PROMPT, "stream": True, "temperature": 0}
    t0 = time.perf_counter()  # this engine's speed, to know how long the long requests would run
    r = httpx.post(f"{url}/v1/completions", json={**body, "stream": False, "max_tokens": 200}, timeout=60)
    assert r.json()["choices"][0]["finish_reason"] == "length"  # greedy on this prompt does not stop early
    seconds_per_token = (time.perf_counter() - t0) / 200
    long = 1900
    for _ in range(SLOTS):  # every slot busy with a long generation, then the clients leave
        with httpx.stream("POST", f"{url}/v1/completions", json={**body, "max_tokens": long}, timeout=60) as r:
            assert r.status_code == 200
            assert next(r.iter_lines()).startswith("data: ")
    t_left = time.perf_counter()
    while _load(url, model)["running"] and time.perf_counter() - t_left < 60:
        time.sleep(0.05)
    freed_after = time.perf_counter() - t_left
    assert _load(url, model) == {"running": 0, "waiting": 0}
    assert freed_after < 0.5 * long * seconds_per_token, (freed_after, long * seconds_per_token)
    r = httpx.post(f"{url}/v1/completions", json={**body, "stream": False, "max_tokens": 4}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_client_errors_over_http(server, client):
    import openai

    url, _ = server
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x")
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny-random-ar", prompt="x", n=2)
    assert e.value.body["param"] == "n"
    r = httpx.post(f"{url}/v1/chat/completions", content=b'{"model": ', headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    assert httpx.get(f"{url}/health").json()["status"] == "ok"  # the replica took all of it
