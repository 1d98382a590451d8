"""Cross-field rules of the config, checked when it is built (`load_config`), before torch or Ray start.

A field's own value set is checked by overrides.check_choices; these are the combinations that cannot work, each
found today only minutes into a job (a division by zero at the first log line, a DeepSpeed assertion in
every Train worker, a crash at the first validation). Every error names the field that fixes it, in the
manner of torchtitan's `_validate_cuda_graphs`. Pure Python (no torch, no Ray); `cfg` is a schema.Config
(duck-typed: only the attributes are read).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from lilicorr.config.choices import ConfigError


def accumulation(global_batch: int, workers: int, micro_batch: Optional[int]) -> tuple[int, int]:
    """(micro_batch, grad_accum) with global_batch = workers x micro_batch x grad_accum, or ConfigError.
    micro_batch None = global_batch / workers (no accumulation)."""
    if global_batch <= 0:
        raise ConfigError(f"train.global_batch_size={global_batch} must be positive")
    if workers <= 0:
        raise ConfigError(f"train.num_workers={workers} must be positive")
    if global_batch % workers != 0:
        raise ConfigError(f"train.global_batch_size={global_batch} is not divisible by train.num_workers={workers}")
    if micro_batch is None:
        return global_batch // workers, 1
    per_worker = global_batch // workers
    if micro_batch <= 0 or per_worker % micro_batch != 0:
        raise ConfigError(f"train.global_batch_size={global_batch} is not divisible by train.num_workers={workers} "
                          f"x train.micro_batch={micro_batch}; set train.micro_batch to a divisor of {per_worker}")
    return micro_batch, per_worker // micro_batch


# The smallest value of each count, size and interval (None passes where the field allows it): checked in one place.
MINIMUMS = {
    "train.val_batch_size": 1, "train.val_max_rows": 1, "train.shuffle_rows": 1, "train.max_failures": 0,
    "train.log_every": 1, "train.checkpoint_every": 1, "train.validate_every": 1,  # step % N in the training loop
    "eval.speed_repeats": 1, "head.top_k": 1, "drafter.anchors_per_seq": 1, "drafter.block_size": 2,
    "drafter.draft_vocab": 0, "engine.draft_vocab": 0,
    "data.rows_per_shard": 1, "data.max_turns": 1, "data.vllm_tensor_parallel": 1, "data.vllm_wave_shards": 1,
}
# what the error adds where the bound or another value of the field needs saying
MINIMUM_HINTS = {
    "train.val_max_rows": "or null: every held-out row", "data.max_turns": "or null: every turn regenerated",
    "drafter.block_size": "the anchor + one slot to draft", "eval.speed_repeats": "interleaved rounds per setting",
    "drafter.draft_vocab": "0: the full vocabulary", "engine.draft_vocab": "0: the drafter's own vocabulary",
}


def _minimums(cfg: Any) -> None:
    for key, least in MINIMUMS.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value is not None and value < least:
            hint = f" ({MINIMUM_HINTS[key]})" if key in MINIMUM_HINTS else ""
            raise ConfigError(f"{key}={value} must be at least {least}{hint}")


def _training(cfg: Any) -> None:
    t = cfg.train
    accumulation(t.global_batch_size, t.num_workers, t.micro_batch)
    if t.zero_stage not in (0, 1, 2):
        # ZeRO-3 partitions parameters between submodule forwards; JointModel reads drafter parameters
        # directly (the learned mask vector, fc for the feature scale), which would then be empty shards.
        raise ConfigError(f"train.zero_stage={t.zero_stage} is not supported: set train.zero_stage to 0, 1 or 2 "
                          f"(train.precision={t.precision})")
    if not 0.0 <= t.distill <= 1.0:
        raise ConfigError(f"train.distill={t.distill} must be in [0, 1] (the soft labels' share of the CE)")
    if not 0.0 <= cfg.optim.warmup_fraction < 1.0:
        raise ConfigError(f"optim.warmup_fraction={cfg.optim.warmup_fraction} must be in [0, 1)")
    if cfg.optim.lr_grown is not None and (cfg.optim.lr_grown <= 0 or not t.init_from):
        raise ConfigError(f"optim.lr_grown={cfg.optim.lr_grown} is the LR of the drafter layers train.init_from adds "
                          "as the identity: give it a positive value with train.init_from=EXPORT (an export with "
                          "fewer layers than drafter.num_layers), or leave it unset")
    if t.fail_at_step is not None and t.max_failures < 1:
        raise ConfigError(f"train.fail_at_step={t.fail_at_step} kills a worker once; with "
                          "train.max_failures=0 the run fails instead of resuming: set train.max_failures >= 1")


def _head(cfg: Any) -> None:
    k, draft_vocab = cfg.head.top_k, cfg.drafter.draft_vocab
    if draft_vocab and k > draft_vocab:
        raise ConfigError(f"head.top_k={k} exceeds the draft vocabulary drafter.draft_vocab={draft_vocab}: "
                          f"lower head.top_k or raise drafter.draft_vocab")
    if cfg.target.source == "random" and k > cfg.target.vocab_size:  # other targets' vocabularies are read later
        raise ConfigError(f"head.top_k={k} exceeds target.vocab_size={cfg.target.vocab_size}: lower head.top_k")


def _local_training(cfg: Any) -> None:
    t = cfg.train
    if t.runner != "local":
        return
    if t.num_workers != 1:
        raise ConfigError(f"train.runner=local trains in this process on one device; train.num_workers={t.num_workers}"
                          " needs Ray Train: set train.num_workers=1 or train.runner=ray")
    if t.feature_cache:
        raise ConfigError("train.runner=local reads the shards and runs the target live; the feature cache is built "
                          "by a Ray Data stage: set train.feature_cache=false or train.runner=ray")
    if t.fail_at_step is not None:
        raise ConfigError("train.fail_at_step kills a Ray Train worker; with train.runner=local rerun the job to "
                          "resume from its last checkpoint instead: drop train.fail_at_step")


def _regeneration(cfg: Any) -> None:
    d = cfg.data
    if d.start_row < 0 or d.start_row % d.rows_per_shard:
        raise ConfigError(f"data.start_row={d.start_row} must be a multiple of data.rows_per_shard="
                          f"{d.rows_per_shard} (shard s holds source rows [s*R, (s+1)*R)): round it down")


def _vllm(cfg: Any) -> None:
    d = cfg.data
    if d.generate_backend != "vllm":
        return
    if cfg.target.source == "random":  # vLLM loads weights from disk; a random target exists only in memory
        raise ConfigError("data.generate_backend=vllm loads the target from a folder or the hub, and "
                          "target.source=random has neither: set target.source=embedded:smollm2-135m, local:<dir> or "
                          "hf:<repo>, or data.generate_backend=engine")
    if d.use_gpu is False:  # Ray Data LLM's vLLM stage reserves tp x pp GPUs per engine: on CPUs it never schedules
        raise ConfigError("data.generate_backend=vllm runs vLLM on GPU nodes (Ray Data LLM reserves "
                          "data.vllm_tensor_parallel GPUs per engine), and data.use_gpu=false has none: "
                          "drop data.use_gpu=false or set data.generate_backend=engine")


def _yarn(cfg: Any) -> None:
    f = cfg.target.yarn_factor
    if f is not None and not f > 1:
        raise ConfigError(f"target.yarn_factor={f} must be > 1 (it multiplies the target's context), or none for "
                          "the checkpoint's own RoPE")


RULES: tuple[Callable[[Any], None], ...] = (_minimums, _training, _head, _local_training, _regeneration, _vllm, _yarn)


def check_rules(cfg: Any) -> None:
    """ConfigError naming the field to change when a combination of settings cannot work."""
    for rule in RULES:
        rule(cfg)
