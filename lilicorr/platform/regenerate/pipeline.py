"""Ray Data regeneration of a training corpus with the target (paper §4.1).

    summary = run_regeneration(load_config("smollm2-135m", ["data.limit=64"]))

Keeps every conversation's system and user messages and regenerates each assistant turn with the
target — greedy, reasoning disabled, at most `data.max_new_tokens` tokens — then writes
`input_ids` / `loss_mask` Parquet shards and a manifest (regenerate/shards.py).

`data.runner=local` runs the same generator in this process, shard after shard, without Ray (a single GPU
machine; `jobs/regenerate.py ... data.runner=local`).

Pipeline (one Ray Data dataset, streamed):
    shard tasks ──flat_map(read_shard_rows)──> raw rows ──map_batches(ConversationRegenerator,
    actor pool of data.num_actors, one GPU each on a GPU cluster)──> rows ──driver──> shard files
The driver gathers rows per shard; when all of a shard's rows are back (skipped rows included) it
writes the shard and records it. Finished shards are not scheduled again, so rerunning a killed
job resumes it, and rows are placed by source index, so the result is the same as one clean run.
Rows of a generate call that failed (an OOM) are skipped and counted as `generate_error` (reason in the
summary's `generate_errors`); their shard is finished all the same, and `data.retry_failed=true`
reschedules exactly the shards that have such rows.

`data.generate_backend=vllm` replaces the actor stage by Ray Data LLM's vLLM processor driven from here
(vllm_processor.py); shard tasks, writing, resuming and the counts stay the same.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Optional

from lilicorr.config import Config
from lilicorr.platform.regenerate.conversations import GENERATE_ERROR, sample_record
from lilicorr.platform.regenerate.read import ShardTask, count_rows, plan_shards, read_shard_rows, resolve_source
from lilicorr.platform.regenerate.shards import SPLITS, ShardStore
from lilicorr.platform.regenerate.summary import Progress, shard_counts, summary, total

ShardHook = Callable[[int, dict[str, Any]], None]
SAMPLES = 8  # regenerated conversations the summary shows (and MLflow keeps as samples.jsonl)


def run_regeneration(cfg: Config, *, on_shard_done: Optional[ShardHook] = None) -> dict[str, Any]:
    """Regenerate the configured corpus (resuming a previous run); returns the summary dict.

    `on_shard_done(shard, counts)` runs after each shard is durably written (tests use it to kill a run).
    The summary has the whole corpus so far under "corpus", this run's work under "this_run", plus
    "samples" (the first SAMPLES regenerated conversations) and "manifest".
    """
    import pyarrow.compute as pc

    if cfg.data.generate_backend == "vllm":
        from lilicorr.platform.regenerate.vllm_processor import preflight

        preflight(cfg)  # before Ray starts or the store is touched: vllm must import where the job runs
    src = resolve_source(cfg.data.source)
    num_rows = count_rows(src)
    if cfg.data.limit is not None:
        num_rows = min(num_rows, cfg.data.limit)
    plan = plan_shards(src, num_rows, cfg.data.rows_per_shard, cfg.data.start_row)
    store = ShardStore(cfg.data.output_dir)
    store.open(cfg, num_rows, -(-num_rows // cfg.data.rows_per_shard))  # shard numbers as from row 0
    pending = pending_shards(plan, store, cfg.data.retry_failed)
    progress = Progress(len(plan), len(plan) - len(pending))
    progress.line(f"{src.name}: rows {cfg.data.start_row}-{num_rows} in {len(plan)} shards of {cfg.data.rows_per_shard}; "
                  f"{len(plan) - len(pending)} already finished, {len(pending)} to do -> {store.uri}")

    run_entries: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    shards = _regenerated_shards(cfg, src, pending) if pending else iter(())
    try:
        for task, table in shards:
            counts = shard_counts(table)
            kept = table.filter(pc.equal(table["skip_reason"], ""))
            store.write_shard(task.shard, task.start, task.stop,
                              {s: kept.filter(pc.equal(kept["split"], s)) for s in SPLITS}, counts)
            run_entries.append(counts)
            progress.shard_done(task.shard, task.start, task.stop, counts)
            samples += [sample_record(r) for r in kept.slice(0, SAMPLES - len(samples)).to_pylist()]
            if on_shard_done is not None:
                on_shard_done(task.shard, counts)
    finally:
        if hasattr(shards, "close"):
            shards.close()  # stops the Ray Data executor (and frees its actors) when a run is cut short

    result = summary(total(list(store.finished_entries().values())), total(run_entries), progress.elapsed,
                     store.uri)
    result["samples"] = samples
    result["manifest"] = store.manifest
    return result


def pending_shards(plan: list[ShardTask], store: ShardStore, retry_failed: bool = False) -> list[ShardTask]:
    """The shards this run generates: those not finished, plus (retry_failed) the finished ones whose rows a
    failed generate call skipped. Without retry_failed a failure is final for the corpus: the shard was
    written without those rows and counted, so a rerun moves on instead of hitting the same batch forever."""
    entries = store.finished_entries()
    return [t for t in plan if not store.is_finished(t.shard, t.start, t.stop)
            or (retry_failed and entries[t.shard].get("skipped", {}).get(GENERATE_ERROR, 0) > 0)]


def _regenerated_shards(cfg: Config, src, pending: list[ShardTask]):
    """Yield (task, actor-output table sorted by row) for each pending shard as it completes."""
    if cfg.data.generate_backend == "vllm":
        from lilicorr.platform.regenerate.vllm_processor import regenerated_shards

        yield from regenerated_shards(cfg, src, pending)
        return
    if cfg.data.runner == "local":
        batches = _local_batches(cfg, src, pending)
    else:
        batches = build_dataset(cfg, src, pending).iter_batches(batch_size=None, batch_format="pyarrow")
    try:
        yield from _complete_shards(batches, {t.shard: t for t in pending})
    finally:
        if hasattr(batches, "close"):  # stops the Ray Data executor (and frees its actors) when a run is cut short
            batches.close()


def _local_batches(cfg: Config, src, pending: list[ShardTask]):
    """data.runner=local: the actor's work in this process, shard after shard, one actor call (call_rows rows,
    one length-sorting group) at a time: what the Ray pipeline does, on one machine without Ray."""
    import pyarrow as pa

    from lilicorr.platform.regenerate.actor import ConversationRegenerator, call_rows

    generator = ConversationRegenerator(cfg.to_dict())
    n = call_rows(cfg.data)
    for task in pending:
        rows = read_shard_rows(dataclasses.asdict(task), src=src, heldout_fraction=cfg.data.heldout_fraction)
        for i in range(0, len(rows), n):
            yield generator(pa.Table.from_pylist(rows[i:i + n]))


def _complete_shards(batches, tasks: dict[int, ShardTask]):
    import pyarrow as pa
    import pyarrow.compute as pc

    parts: dict[int, list] = {}
    got: dict[int, int] = {}
    for batch in batches:
        for shard in sorted(set(batch["shard"].to_pylist())):
            part = batch.filter(pc.equal(batch["shard"], shard))
            parts.setdefault(shard, []).append(part)
            got[shard] = got.get(shard, 0) + part.num_rows
            task = tasks[shard]
            if got[shard] < task.stop - task.start:
                continue
            table = pa.concat_tables(parts.pop(shard)).sort_by("row_index")
            rows = table["row_index"].to_pylist()
            if rows != list(range(task.start, task.stop)):
                raise RuntimeError(f"shard {shard}: rows {rows[:5]}... are not exactly [{task.start}, {task.stop})")
            yield task, table
    if parts:
        raise RuntimeError(f"pipeline ended with shards {sorted(parts)} incomplete")


def build_dataset(cfg: Config, src, pending: list[ShardTask]):
    """The lazy Ray Data pipeline over the pending shards (see the module docstring)."""
    import ray

    from lilicorr.platform.regenerate.actor import ConversationRegenerator, call_rows

    ray_init()
    resources = ray.cluster_resources()
    use_gpu = cfg.data.use_gpu if cfg.data.use_gpu is not None else resources.get("GPU", 0) >= 1
    num_actors = max(1, cfg.data.num_actors)
    # CPU actors: split the cores between them (Ray would leave each with one thread); never more
    # threads than a node has (this node's count stands in for the others').
    threads = None if use_gpu else max(1, min(int(resources.get("CPU", 1)) // num_actors, os.cpu_count() or 1))
    ds = ray.data.from_items([dataclasses.asdict(t) for t in pending], override_num_blocks=len(pending))
    # This dataset's own context (a copy; the process-wide one is left alone): shards finish in order,
    # so progress is steady and the driver buffers about one shard at a time. (On Ray 2.60 a finished actor call's
    # block reached the driver only when the next call finished, with or without preserve_order: a killed run
    # loses one call more than the one in flight.)
    ds.context.execution_options.preserve_order = True
    ds = ds.flat_map(read_shard_rows, fn_kwargs={"src": src, "heldout_fraction": cfg.data.heldout_fraction})
    # One call = one length-sorting group (actor.call_rows): sort_window generate batches of data.batch_size.
    return ds.map_batches(
        ConversationRegenerator,
        fn_constructor_kwargs={"cfg_dict": cfg.to_dict(), "torch_threads": threads},
        batch_size=call_rows(cfg.data), batch_format="pyarrow", compute=ray.data.ActorPoolStrategy(size=num_actors),
        num_gpus=1 if use_gpu else 0, num_cpus=1,
    )


def ray_init() -> None:
    import ray

    if not ray.is_initialized():
        ray.init(**({} if os.environ.get("RAY_ADDRESS") else {"include_dashboard": False}))

