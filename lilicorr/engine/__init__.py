"""The speculative decoder every job uses. Never imports Ray, DeepSpeed or MLflow.

Public entry points (import the modules directly; this package imports nothing, so it stays light):
  systems.build_decoder(cfg, hf_model, system, checkpoint=None, stop_ids=(), timing=False) -> Decoder
      system: ar | dflash | lilicorr | lilicorr-viterbi | lilicorr-margin | domino | dspark | dspark-sampled
  decoder.Decoder (= scheduler.Decoder): add_request(Request) (QueueFull past engine.max_waiting) /
      step_deltas() -> [Delta] / step() -> finished [Result] / generate([Request]) -> [Result] /
      abort(id) -> bool / validate(Request) / warmup(); .stats (DecodeStats), .timers (Table 3 stages)
  threaded.EngineThread(decoder): a daemon thread runs the step loop; submit(req, on_delta) / abort(id)
  simple.generate_ids(hf_model, prompts, max_new_tokens, stop_ids) -> [[ids]]
  target_forward.TargetForward: our Llama/Qwen3 forward over kv_cache.KVCache (per-row lengths)
  verify.verify(p, Candidates, uniforms, q=None): chain or tree, exact at any temperature
Files: scheduler (requests, slots, admission, queue, deltas; decoder re-exports its Decoder), runner (prefill,
draft, verify, commit on the model), target_forward (layer: a layer's weights / shape records and its eager step;
one_row_layer: the compiled batch-1 step; scripted_stack: every layer in one TorchScript call; attention, rope),
kv_cache, candidates, verify, sampling, drafting, ddtree, systems, backend (which implementation runs each
computation, resolved once per decoder), stats, requests, threaded, cuda_graphs (GPU only), simple, measure* and
bench_sections (tokens/s, forward costs, bandwidth, the GPU
figures; the CLIs are platform/bench/, `jobs/bench.py`). Test helpers live in tests/engine/engine_helpers.py.
"""
