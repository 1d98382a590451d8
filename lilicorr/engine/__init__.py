"""The speculative decoder every job uses. Never imports Ray, DeepSpeed or MLflow.

Public entry points (import the modules directly; this package imports nothing, so it stays light):
  systems.build_decoder(cfg, hf_model, system, checkpoint=None, stop_ids=(), timing=False) -> Decoder
      system: ar | dflash | lilicorr | lilicorr-viterbi | lilicorr-margin | domino | dspark | dspark-sampled
  decoder.Decoder: add_request(Request) / step() -> finished [Result] / generate([Request]) -> [Result];
      .stats (DecodeStats: tau, tokens_per_s, per-slot acceptance), .timers (paper Table 3 stages)
  simple.generate_ids(hf_model, prompts, max_new_tokens, stop_ids) -> [[ids]]
  target_forward.TargetForward: our Llama/Qwen3 forward over kv_cache.KVCache (per-row lengths)
  verify.verify(p, Candidates, uniforms, q=None): chain or tree, exact at any temperature
Files: target_forward, kv_cache, candidates, verify, sampling, drafting, decoder, systems, stats,
requests, cuda_graphs (GPU only), simple, measure (tokens/s, forward costs, bandwidth; the CLI is
platform/bench/engine.py, `jobs/bench.py engine`). Test helpers live in tests/engine_helpers.py.
"""
