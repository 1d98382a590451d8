"""Serve benchmark (not a test): load with the official `openai` client, and an OpenAPI fuzz run.

    python jobs/bench.py serve --preset smollm2-135m --clients 32:60,8:30,1:30 [--max-tokens 64]
    python jobs/bench.py serve --preset tiny-random --drafter random --fuzz 150 --clients ""

Starts the app in-process on 127.0.0.1 (a private local Ray; a free port) unless --url names a running
server. Load: each level `N:SECONDS` runs N concurrent clients, each sending streamed greedy chat requests
(MT-Bench first turns) back to back until the time is up; requests in flight then get --grace seconds
to finish and are cut after it (`cut_at_end`; the server aborts them; not errors). Per level: requests,
errors (by kind), p50/p99 latency, p50/p99 time to first token, aggregate completion tokens/s (tokens of
finished requests / wall time until the last one finished) and mean tau from `usage`.
--in-process N: the first N prompts each through a decoder built in this process from the served model's config and
over HTTP, interleaved: what one client loses through the app (bench/serve_in_process.py).
Fuzz: `st run` (schemathesis) over the app's /openapi.json for --fuzz seconds with the
not_a_server_error check; counts requests and 5xx from its HAR report. Last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Optional

from lilicorr.bench.harness import json_line, logger

_log = logger("serve")


def percentile(xs: list[float], q: float) -> Optional[float]:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def load_prompts(n: int = 80) -> list[str]:
    try:
        from lilicorr.platform.assets import mt_bench

        return [q["turns"][0] for q in mt_bench()][:n]
    except Exception as e:  # assets not installed: still a load
        _log(f"MT-Bench not available ({e}); using built-in prompts")
        return ["Write a haiku about the sea.", "Explain recursion to a child.", "List three prime numbers.",
                "What is the capital of France?", "Summarize the plot of Hamlet in two sentences."]


def openai_client(url: str, api_key: str, clients: int, timeout_s: float):
    """The official async client for `clients` concurrent requests to the app at `url` (a connection each, a few
    spare), never retrying: a failed request is counted, not hidden."""
    import httpx
    from openai import AsyncOpenAI

    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    return AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=timeout_s,
                       http_client=httpx.AsyncClient(limits=limits, timeout=timeout_s))


def served_models(url: str, api_key: str) -> list[str]:
    """The model ids the app at `url` serves (GET /v1/models), in its order."""
    import httpx

    return [m["id"] for m in httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {api_key}"},
                                       timeout=30).json()["data"]]


def new_record() -> dict:
    """What stream_request adds up over the requests of one level or cell."""
    return {"latency": [], "ttft": [], "tau": [], "tokens": 0, "blocks": 0, "accepted": 0, "errors": Counter(),
            "samples": {}, "last_done": None}


def figures(rec: dict, wall: float) -> dict:
    """A level's or cell's figures from its record and wall time (p50s; callers add what is theirs)."""
    return {"requests": len(rec["latency"]), "errors": sum(rec["errors"].values()), "error_kinds": dict(rec["errors"]),
            "error_samples": rec["samples"], "completion_tokens": rec["tokens"], "wall_s": wall,
            "tokens_per_s": rec["tokens"] / wall if wall else 0.0, "ttft_p50_s": percentile(rec["ttft"], 50),
            "latency_p50_s": percentile(rec["latency"], 50)}


async def stream_request(aclient, model: str, messages: list[dict], max_tokens: int, rec: dict) -> bool:
    """One streamed greedy chat request, added to `rec` (new_record): its latency, time to first token and usage
    (tokens, τ, blocks and accepted drafts), or its error counted by kind. Whether it succeeded."""
    t0 = time.perf_counter()
    ttft, use = None, None
    try:
        stream = await aclient.chat.completions.create(
            model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True})
        async for chunk in stream:
            if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                ttft = time.perf_counter() - t0
            if chunk.usage is not None:
                use = chunk.usage
        if use is None:
            raise RuntimeError("stream ended without a usage chunk")
    except Exception as e:  # counted, never fatal for the run
        rec["errors"][type(e).__name__] += 1
        rec["samples"].setdefault(type(e).__name__, str(e)[:300])
        return False
    rec["latency"].append(time.perf_counter() - t0)
    if ttft is not None:
        rec["ttft"].append(ttft)
    extra = use.model_extra or {}
    rec["tokens"] += use.completion_tokens
    rec["blocks"] += int(extra.get("blocks", 0) or 0)
    rec["accepted"] += int(extra.get("accepted_tokens", 0) or 0)
    if extra.get("blocks"):
        rec["tau"].append(float(extra["tau"]))
    rec["last_done"] = time.perf_counter()
    return True


async def _client(aclient, model: str, prompts: list[str], deadline: float, max_tokens: int, rng: random.Random,
                  rec: dict) -> None:
    while time.perf_counter() < deadline:
        if not await stream_request(aclient, model, [{"role": "user", "content": rng.choice(prompts)}], max_tokens,
                                    rec):
            await asyncio.sleep(0.05)


async def run_level(url: str, model: str, clients: int, seconds: float, max_tokens: int, prompts: list[str],
                    api_key: str, seed: int = 0, grace_s: float = 30.0) -> dict:
    rec = new_record()
    async with openai_client(url, api_key, clients, 600) as aclient:
        t0 = time.perf_counter()
        deadline = t0 + seconds
        tasks = [asyncio.create_task(_client(aclient, model, prompts, deadline, max_tokens, random.Random(seed + i),
                                             rec)) for i in range(clients)]
        _, late = await asyncio.wait(tasks, timeout=seconds + grace_s)
        for t in late:  # still running after the grace period: cut (the server aborts them), not counted
            t.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        wall = (rec["last_done"] or time.perf_counter()) - t0
    return {"clients": clients, "seconds": seconds, "cut_at_end": len(late), **figures(rec, wall),
            "latency_p99_s": percentile(rec["latency"], 99), "ttft_p99_s": percentile(rec["ttft"], 99),
            "mean_tau": statistics.fmean(rec["tau"]) if rec["tau"] else None}


def fuzz(url: str, seconds: int, api_key: Optional[str]) -> dict:
    """schemathesis over /openapi.json for `seconds`; counts from its HAR report."""
    st = os.path.join(os.path.dirname(sys.executable), "st")
    with tempfile.TemporaryDirectory() as tmp:
        har = os.path.join(tmp, "fuzz.har")
        cmd = [st, "run", f"{url}/openapi.json", "--checks", "not_a_server_error", "--max-time", str(seconds),
               "--workers", "2", "--request-timeout", "120", "--report", "har", "--report-har-path", har,
               "--suppress-health-check", "all", "--continue-on-failure"]
        if api_key:
            cmd += ["-H", f"Authorization: Bearer {api_key}"]
        _log(" ".join(cmd))
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        print(tail, file=sys.stderr, flush=True)
        statuses: Counter = Counter()
        if os.path.exists(har):
            with open(har) as f:
                entries = json.load(f).get("log", {}).get("entries", [])
            statuses.update(int(e["response"]["status"]) for e in entries if e.get("response"))
    return {"seconds": round(time.time() - t0, 1), "exit_code": proc.returncode, "requests": sum(statuses.values()),
            "server_errors_5xx": sum(n for s, n in statuses.items() if s >= 500),
            "by_status": {str(k): v for k, v in sorted(statuses.items())}}


def parse_levels(spec: str) -> list[tuple[int, float]]:
    levels = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        n, _, s = part.partition(":")
        levels.append((int(n), float(s or 60)))
    return levels


def main(argv: Optional[list[str]] = None) -> dict:
    p = argparse.ArgumentParser(prog="bench.py serve", description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="smollm2-135m")
    p.add_argument("--url", default=None, help="a running server (default: start one on 127.0.0.1)")
    p.add_argument("--systems", default="lilicorr", help="systems to serve when starting one")
    p.add_argument("--checkpoint", action="append", default=[])
    p.add_argument("--drafter", default=None, choices=["random"])
    p.add_argument("--model", default=None, help="model to load (default: the first served)")
    p.add_argument("--clients", default="32:60,8:30,1:30", help="levels N:SECONDS, comma-separated ('' = none)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--grace", type=float, default=30.0,
                   help="seconds requests in flight at the end of a level may finish before they are cut")
    p.add_argument("--in-process", type=int, default=0, metavar="N",
                   help="N prompts, one at a time, through an in-process decoder and over HTTP, interleaved")
    p.add_argument("--fuzz", type=int, default=0, help="schemathesis seconds (0 = no fuzz run)")
    p.add_argument("--torch-threads", type=int, default=None, help="intra-op threads of the started replica")
    p.add_argument("--out", default=None, help="also write the JSON summary here")
    p.add_argument("overrides", nargs="*", help="config overrides for the started server")
    args = p.parse_args(argv)
    if args.url and not args.url.startswith(("http://127.0.0.1", "http://localhost")):
        p.error("--url must be a loopback address (http://127.0.0.1:PORT)")
    if args.url and args.in_process:
        p.error("--in-process builds the served model's decoder from --preset, --systems and overrides: start the "
                "server here (leave out --url)")
    def _terminate(*_):  # `timeout` / kill: still stop the started Serve app (finally below)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    api_key = os.environ.get("LILICORR_API_KEY") or "none"
    started = False
    url = args.url
    summary: dict = {"preset": args.preset}
    try:
        if url is None:
            from lilicorr.serve_apps.launch import free_port, start_serve
            from lilicorr.serve_apps.loading import ServeSpec

            spec = ServeSpec(preset=args.preset, overrides=list(args.overrides),
                             systems=[s for s in args.systems.split(",") if s], checkpoints=list(args.checkpoint),
                             drafter=args.drafter, torch_threads=args.torch_threads)
            t0 = time.time()
            url = start_serve(spec, "127.0.0.1", free_port())
            started = True
            _log(f"server up at {url} in {time.time() - t0:.1f}s")
        models = served_models(url, api_key)
        model = args.model or models[0]
        summary.update(url=url, model=model, models=models, max_tokens=args.max_tokens, levels=[])
        prompts = load_prompts()
        for clients, seconds in parse_levels(args.clients):
            _log(f"{clients} clients for {seconds:.0f}s on {model}")
            res = asyncio.run(run_level(url, model, clients, seconds, args.max_tokens, prompts, api_key,
                                        grace_s=args.grace))
            _log(json.dumps(res))
            summary["levels"].append(res)
        if args.in_process:
            from lilicorr.bench.serve_in_process import compare

            _log(f"{args.in_process} prompts in-process and over HTTP, interleaved, on {model}")
            summary["in_process"] = compare(url, model, spec, prompts[:args.in_process], args.max_tokens, api_key, _log)
            _log(json.dumps(summary["in_process"]))
        if args.fuzz:
            summary["fuzz"] = fuzz(url, args.fuzz, None if api_key == "none" else api_key)
            _log(json.dumps(summary["fuzz"]))
    finally:
        if started:
            from lilicorr.serve_apps.launch import stop_serve

            stop_serve()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=2)
    return json_line(summary, load_average=False)
