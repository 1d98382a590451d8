"""`jobs/bench.py serve --in-process N`: what one client loses through the Serve app, against the same engine in
this process (issue 41 item 4).

The first N MT-Bench prompts each go, one request at a time, through a decoder built here from the served model's
own config and drafter (`Decoder.generate`, no HTTP, no Ray) and through the server over HTTP (streamed, the
`openai` client, as `--clients` levels send them), the two arms alternating which goes first, prompt by prompt.
Per request: completion tokens / (finish - send), prefill included on both sides. Reported: each arm's tok/s
(tokens / seconds, pooled), the HTTP / in-process ratio with its 95% bootstrap interval over prompts, and whether
every output is the same text. The server keeps running beside this process, as it does under load, so both arms
pay for the Ray processes around them.
"""

from __future__ import annotations

import time

import numpy as np


def compare(url: str, model: str, spec, prompts: list[str], max_tokens: int, api_key: str, log) -> dict:
    """Interleaved in-process vs HTTP requests on `prompts` (see the module docstring); `spec` is the server's
    ServeSpec, `model` its served name `<preset>-<system>`."""
    from openai import OpenAI

    from lilicorr.config import load_config
    from lilicorr.engine.requests import Request
    from lilicorr.engine.systems import build_decoder
    from lilicorr.platform.assets import eos_token_ids, load_target
    from lilicorr.platform.chat import prompt_ids
    from lilicorr.platform.intervals import interval, speed_ratio
    from lilicorr.serve_apps.loading import resolve_checkpoints

    system = model.removeprefix(f"{spec.preset}-")
    cfg = load_config(spec.preset, list(spec.overrides))
    hf_model, tokenizer = load_target(cfg.target)
    decoder = build_decoder(cfg, hf_model, system, checkpoint=resolve_checkpoints(spec).get(system),
                            stop_ids=eos_token_ids(cfg.target, tokenizer))
    decoder.warmup()
    client = OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=600)

    def in_process(i: int, text: str) -> tuple[int, float, str]:
        ids = prompt_ids(tokenizer, [{"role": "user", "content": text}], cfg.target.enable_thinking)
        t0 = time.perf_counter()
        out = decoder.generate([Request(f"in-process-{i}", ids, max_new_tokens=max_tokens, temperature=0)])[0]
        seconds = time.perf_counter() - t0
        # the server's text: special tokens (the stop token) skipped, no clean-up (serve_apps/detok.py)
        text = tokenizer.decode(out.output_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        return len(out.output_ids), seconds, text

    def over_http(i: int, text: str) -> tuple[int, float, str]:
        t0 = time.perf_counter()
        tokens, parts = 0, []
        stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}],
                                                max_tokens=max_tokens, temperature=0, stream=True,
                                                stream_options={"include_usage": True})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return tokens, time.perf_counter() - t0, "".join(parts)

    in_process(-1, prompts[0])  # one untimed request each: first-call costs on both sides
    over_http(-1, prompts[0])
    rows, same = [], 0
    for i, text in enumerate(prompts):
        arms = (over_http, in_process) if i % 2 else (in_process, over_http)
        got = {fn.__name__: fn(i, text) for fn in arms}
        (tok_h, sec_h, text_h), (tok_p, sec_p, text_p) = got["over_http"], got["in_process"]
        rows.append((tok_h, sec_h, tok_p, sec_p))
        same += text_h == text_p
        log(f"in-process {i + 1}/{len(prompts)}: http {tok_h / sec_h:.1f} tok/s, in-process {tok_p / sec_p:.1f}")
    r = np.array(rows, dtype=float)
    lo, hi = interval(r, speed_ratio, np.random.default_rng(0))
    return {"model": model, "prompts": len(prompts), "max_tokens": max_tokens,
            "http_tokens_per_s": round(r[:, 0].sum() / r[:, 1].sum(), 2),
            "in_process_tokens_per_s": round(r[:, 2].sum() / r[:, 3].sum(), 2),
            "http_over_in_process": round(speed_ratio(r), 4), "ci95": [round(lo, 4), round(hi, 4)],
            "same_text": same}
