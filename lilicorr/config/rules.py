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


def _batch(cfg: Any) -> None:
    t = cfg.train
    accumulation(t.global_batch_size, t.num_workers, t.micro_batch)
    if t.val_batch_size < 1:
        raise ConfigError(f"train.val_batch_size={t.val_batch_size} must be at least 1")
    if t.val_max_rows is not None and t.val_max_rows < 1:
        raise ConfigError(f"train.val_max_rows={t.val_max_rows} must be at least 1 (or none: every held-out row)")
    if t.shuffle_rows < 1:
        raise ConfigError(f"train.shuffle_rows={t.shuffle_rows} must be at least 1")


def _intervals(cfg: Any) -> None:
    for name in ("log_every", "checkpoint_every", "validate_every"):  # step % N in the training loop
        if getattr(cfg.train, name) < 1:
            raise ConfigError(f"train.{name}={getattr(cfg.train, name)} must be at least 1")
    if cfg.eval.speed_repeats < 1:
        raise ConfigError(f"eval.speed_repeats={cfg.eval.speed_repeats} must be at least 1 (interleaved rounds per setting)")


def _precision(cfg: Any) -> None:
    stage = cfg.train.zero_stage
    if stage not in (0, 1, 2):
        # ZeRO-3 partitions parameters between submodule forwards; JointModel reads drafter parameters
        # directly (the learned mask vector, fc for the feature scale), which would then be empty shards.
        raise ConfigError(f"train.zero_stage={stage} is not supported: set train.zero_stage to 0, 1 or 2 "
                          f"(train.precision={cfg.train.precision})")


def _drafter(cfg: Any) -> None:
    d = cfg.drafter
    if d.block_size < 2:
        raise ConfigError(f"drafter.block_size={d.block_size} must be at least 2 (the anchor + one slot to draft)")
    if d.anchors_per_seq < 1:
        raise ConfigError(f"drafter.anchors_per_seq={d.anchors_per_seq} must be at least 1")
    if d.draft_vocab < 0:
        raise ConfigError(f"drafter.draft_vocab={d.draft_vocab} must be 0 (the full vocabulary) or positive")
    if cfg.engine.draft_vocab < 0:
        raise ConfigError(f"engine.draft_vocab={cfg.engine.draft_vocab} must be 0 (the drafter's own vocabulary) or "
                          "positive (that many of its export's most frequent tokens)")


def _head(cfg: Any) -> None:
    k = cfg.head.top_k
    if k < 1:
        raise ConfigError(f"head.top_k={k} must be at least 1")
    vocab = cfg.drafter.draft_vocab or cfg.target.vocab_size  # vocab_size: the random target's (else read later)
    if cfg.drafter.draft_vocab and k > vocab:
        raise ConfigError(f"head.top_k={k} exceeds the draft vocabulary drafter.draft_vocab={vocab}: "
                          f"lower head.top_k or raise drafter.draft_vocab")
    if cfg.target.source == "random" and k > cfg.target.vocab_size:
        raise ConfigError(f"head.top_k={k} exceeds target.vocab_size={cfg.target.vocab_size}: lower head.top_k")


def _loss(cfg: Any) -> None:
    if not 0.0 <= cfg.train.distill <= 1.0:
        raise ConfigError(f"train.distill={cfg.train.distill} must be in [0, 1] (the soft labels' share of the CE)")
    if not 0.0 <= cfg.optim.warmup_fraction < 1.0:
        raise ConfigError(f"optim.warmup_fraction={cfg.optim.warmup_fraction} must be in [0, 1)")


def _faults(cfg: Any) -> None:
    if cfg.train.max_failures < 0:
        raise ConfigError(f"train.max_failures={cfg.train.max_failures} must be 0 or more")
    if cfg.train.fail_at_step is not None and cfg.train.max_failures < 1:
        raise ConfigError(f"train.fail_at_step={cfg.train.fail_at_step} kills a worker once; with "
                          "train.max_failures=0 the run fails instead of resuming: set train.max_failures >= 1")


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
    if d.rows_per_shard < 1:
        raise ConfigError(f"data.rows_per_shard={d.rows_per_shard} must be at least 1")
    if d.start_row < 0 or d.start_row % d.rows_per_shard:
        raise ConfigError(f"data.start_row={d.start_row} must be a multiple of data.rows_per_shard="
                          f"{d.rows_per_shard} (shard s holds source rows [s*R, (s+1)*R)): round it down")
    if d.max_turns is not None and d.max_turns < 1:
        raise ConfigError(f"data.max_turns={d.max_turns} must be at least 1 (None regenerates every turn)")


def _vllm(cfg: Any) -> None:
    d = cfg.data
    for name in ("vllm_tensor_parallel", "vllm_wave_shards"):
        if getattr(d, name) < 1:
            raise ConfigError(f"data.{name}={getattr(d, name)} must be at least 1")
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


RULES: tuple[Callable[[Any], None], ...] = (_batch, _intervals, _precision, _drafter, _head, _loss, _faults,
                                            _local_training, _regeneration, _vllm, _yarn)


def check_rules(cfg: Any) -> None:
    """ConfigError naming the field to change when a combination of settings cannot work."""
    for rule in RULES:
        rule(cfg)
