"""data.generate_backend=vllm: regeneration through Ray Data LLM's vLLM processor, for GPU clusters.

    vLLMEngineProcessorConfig(model_source=<the target's folder or hub id>, batch_size=data.batch_size,
                              concurrency=data.num_actors, engine_kwargs={tensor_parallel_size:
                              data.vllm_tensor_parallel, dtype: target.dtype, max_model_len, ...})
    build_processor(config, preprocess=vllm_rows.preprocess)      (Ray 2.60's ray.data.llm)

Turns are regenerated in order (each later prompt holds the target's own earlier answers), and a Ray Data LLM
processor maps one request to one answer, so the driver runs actor.regenerate_rows itself, over a wave of
`data.vllm_wave_shards` shards at a time, with a generate function (vllm_rows.RequestGenerate) whose every call
— one assistant turn of all the wave's live conversations — is one Ray Data pass through the processor. Rows,
loss masks and skip counts therefore come from the same code as the engine backend's; a failed request skips its
conversation alone (`generate_error`, the processor continues on errors), and the wave's shards are yielded to
pipeline.run_regeneration, which writes and records them as for every backend (a rerun skips them).

Cost of the split: Ray Data starts a processor's engines for each dataset it runs, so a wave pays one engine
start per assistant turn of its longest conversation (its vllm stage's actors load the weights again).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any, Iterator

from lilicorr.config import Config
from lilicorr.config import ConfigError
from lilicorr.platform.regenerate import vllm_rows

INSTALL = ("pip install vllm on the GPU nodes (in the environment `ray start` runs from, the job's driver "
           "included), or set data.generate_backend=engine")


def preflight(cfg: Config) -> None:
    """Before Ray starts: vLLM and Ray Data LLM must import where the job runs (the engines run in its Ray workers,
    which share the nodes' environment). ConfigError naming the fix otherwise."""
    missing = [name for name in ("vllm", "ray.data.llm") if _spec(name) is None]
    if missing:
        raise ConfigError(f"data.generate_backend=vllm needs {' and '.join(missing)} importable in the job's "
                          f"environment: {INSTALL}")


def _spec(name: str):
    try:
        return importlib.util.find_spec(name)
    except ModuleNotFoundError:  # a parent package is missing
        return None


def regenerated_shards(cfg: Config, src, pending, run=None) -> Iterator[tuple[Any, Any]]:
    """Yield (task, output table sorted by row) per pending shard, as pipeline._regenerated_shards does.

    `run` (request rows -> output rows) replaces the Ray Data LLM pass: tests hand it our engine."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from lilicorr.platform.assets import load_tokenizer, target_hf_config
    from lilicorr.platform.regenerate.actor import output_schema, regen_settings, regenerate_rows
    from lilicorr.platform.regenerate.read import read_shard_rows

    tokenizer, hf_config = load_tokenizer(cfg.target), target_hf_config(cfg.target)
    # One generate call per turn of the whole wave: Ray Data LLM batches (data.batch_size) and spreads the requests
    # over its engines itself, so no length groups or call batches of ours.
    settings = dataclasses.replace(regen_settings(cfg, hf_config, tokenizer), batch_size=0, group_rows=0)
    generate = vllm_rows.RequestGenerate(run or RayLLMRun(cfg, hf_config, settings.max_prompt_tokens +
                                                          settings.max_new_tokens))
    wave = max(1, cfg.data.vllm_wave_shards)
    for i in range(0, len(pending), wave):
        tasks = pending[i:i + wave]
        rows = [r for t in tasks for r in read_shard_rows(dataclasses.asdict(t), src=src,
                                                          heldout_fraction=cfg.data.heldout_fraction)]
        table = pa.Table.from_pylist(regenerate_rows(rows, tokenizer, generate, settings), schema=output_schema())
        for t in tasks:
            yield t, table.filter(pc.equal(table["shard"], t.shard)).sort_by("row_index")


def processor_config(cfg: Config, hf_config, max_model_len: int):
    """Ray 2.60's vLLMEngineProcessorConfig for the target (pydantic; builds without vllm installed)."""
    from ray.data.llm import vLLMEngineProcessorConfig

    return vLLMEngineProcessorConfig(
        model_source=vllm_rows.model_source(cfg.target),
        engine_kwargs=vllm_rows.engine_kwargs(cfg.target, hf_config, max_model_len, cfg.data.vllm_tensor_parallel),
        batch_size=cfg.data.batch_size, concurrency=max(1, cfg.data.num_actors),
        # our prompts are token ids already, and regenerate_rows decodes the answers
        chat_template_stage=False, tokenize_stage=False, detokenize_stage=False,
        # a failed request comes back as a row with __inference_error__ (counted as generate_error) instead of
        # failing the whole wave
        should_continue_on_error=True)


class RayLLMRun:
    """Request rows -> vLLM output rows through one Ray Data LLM processor (built once, run once per call)."""

    def __init__(self, cfg: Config, hf_config, max_model_len: int):
        import ray
        from ray.data.llm import build_processor

        from lilicorr.platform.regenerate.pipeline import ray_init

        ray_init()
        tp = cfg.data.vllm_tensor_parallel
        gpus = ray.cluster_resources().get("GPU", 0)
        if gpus < tp:  # the vLLM stage reserves tp GPUs per engine: without them it would wait forever
            raise ConfigError(f"data.generate_backend=vllm needs data.vllm_tensor_parallel={tp} GPUs per engine "
                              f"and the Ray cluster has {gpus:g}: add GPU nodes, lower data.vllm_tensor_parallel, "
                              f"or set data.generate_backend=engine")
        # No postprocess here: Ray 2.60 passes error rows around a user postprocess (their columns would then differ
        # from the others'), so the driver applies vllm_rows.postprocess to every row alike.
        self.processor = build_processor(processor_config(cfg, hf_config, max_model_len),
                                         preprocess=vllm_rows.preprocess)

    def __call__(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        import ray

        ds = self.processor(ray.data.from_items(requests))
        return ds.select_columns(list(vllm_rows.OUTPUT_COLUMNS)).take_all()
