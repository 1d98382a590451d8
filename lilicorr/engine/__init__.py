"""The speculative decoder every job uses. Never imports Ray, DeepSpeed or MLflow.

Public entry points (import the modules directly; this package imports nothing, so it stays light):
  systems.build_decoder(cfg, hf_model, system, checkpoint=None, stop_ids=(), timing=False) -> Decoder
      system: one of config.choices.SystemName (ar, dflash, lilicorr, ...)
  decoder.Decoder (= scheduler.Decoder): add_request(Request) (QueueFull past engine.max_waiting) /
      step_deltas() -> [Delta] / step() -> finished [Result] / generate([Request]) -> [Result] /
      abort(id) -> bool / validate(Request) / warmup(); .stats (DecodeStats), .timers (Table 3 stages)
  threaded.EngineThread(decoder): a daemon thread runs the step loop; submit(req, on_delta) / abort(id)
  target_forward.TargetForward: our Llama/Qwen3 forward over kv_cache.KVCache (per-row lengths)
  verify.verify(p, Candidates, uniforms, q=None): chain or tree, exact at any temperature
What each module holds: README.md's Layout and docs/design.md §2. Test helpers: tests/engine/engine_helpers.py.
"""
