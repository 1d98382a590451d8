"""Named presets (torchtitan style: plain functions returning a `Config`), for `--preset NAME`.

`tiny-random` builds a random-init target of a few MB for tests; `smollm2-135m` is the embedded default that runs
on a laptop; `qwen3-4b` / `qwen3-8b` carry the paper's Table 4 values, and `qwen3-8b-debug` is qwen3-8b's
scale-shaped twin that the test suite runs end to end on the CPU. Pure Python; imports only the schema (and
REPO_ROOT, which names the packaged corpus wherever the job runs).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from lilicorr.config.paths import REPO_ROOT
from lilicorr.config.schema import (Config, DataConfig, DrafterConfig, EngineConfig, EvalConfig, HeadConfig,
                                    OptimConfig, SweepConfig, TargetConfig, TrainConfig)


def tiny_random() -> Config:
    """A random-init target of a few MB and a matching small head: for tests on CPU.

    Llama-shaped by default; `target.arch=qwen3` gives the Qwen3 shape (q/k norms).
    """
    cfg = Config(preset="tiny-random")  # the schema's target: random, Llama-shaped
    cfg.drafter = DrafterConfig(num_layers=2, block_size=4, anchors_per_seq=8)
    cfg.head = HeadConfig(top_k=3, embed_dim=32, num_layers=2, width=32, num_heads=4, ffn_width=64,
                          domino_gru_hidden=32, domino_mlp_hidden=32, dspark_rank=16)
    cfg.train = TrainConfig(global_batch_size=4, seq_len=64, epochs=1, max_steps=20, zero_stage=0,
                            precision="fp32", checkpoint_every=10, validate_every=10)
    cfg.data = DataConfig(limit=16, max_new_tokens=16, rows_per_shard=4, batch_size=4)
    cfg.engine = EngineConfig(max_batch_size=8, max_seq_len=256, max_new_tokens=24)
    cfg.eval = EvalConfig(speed_repeats=1)  # a random target's speed means nothing: one interleaved round
    cfg.sweep = SweepConfig(space=["loss.gamma=0.1|0.25|0.5", "loss.lam=0|1"], num_samples=2, seeds=[],
                            output_dir="outputs/sweep-tiny")
    return cfg


def smollm2_135m() -> Config:
    """The embedded default: packaged SmolLM2-135M-Instruct and ShareGPT, sized for a 2-core CPU."""
    cfg = Config(preset="smollm2-135m")
    cfg.target = TargetConfig(source="embedded:smollm2-135m", arch="llama")
    # Issue 11's recipe (jobs/train_shipped.py trained the shipped drafters with it): 4 captured layers
    # scaled per channel (SmolLM2's residual stream has a few ~10^4 channels that make all contexts alike),
    # a learned mask vector, dense anchors (128 per 384 tokens), the target's greedy token as label plus its
    # soft distribution, the target's states read from the feature cache, constant LR after warmup.
    cfg.drafter = DrafterConfig(num_layers=2, block_size=8, anchors_per_seq=128, loss_decay_beta=4.0,
                                num_captured=4, feature_scaling=True)
    cfg.head = HeadConfig(top_k=4, embed_dim=128, num_layers=2, width=128, num_heads=4, ffn_width=256,
                          domino_gru_hidden=128, domino_mlp_hidden=64, dspark_rank=64)
    cfg.optim = OptimConfig(lr_drafter=1e-3, lr_head=5e-4, schedule="constant")
    # `make demo` trains both heads for 60 steps each (a few minutes on 2 cores once the cache exists).
    cfg.train = TrainConfig(global_batch_size=4, seq_len=384, epochs=1, max_steps=60, num_workers=2,
                            zero_stage=0, precision="fp32", checkpoint_every=20, validate_every=30,
                            feature_cache=True, distill=0.5)
    # Prompts <= 256 tokens + answers <= 96 fit train.seq_len=384: later turns would only be cropped in
    # training, and skipping them keeps regeneration within minutes on 2 CPU cores.
    cfg.data = DataConfig(limit=256, max_new_tokens=96, max_prompt_tokens=256, rows_per_shard=16, num_actors=1,
                          batch_size=16)
    # The drafter in bf16: oneDNN's bf16 GEMMs read half the bytes and ran faster than fp32 here (the fp32 target
    # keeps decoding lossless); DDTree at 4 nodes: a 4-node tree verifies at little more than one AR step, an 8-node
    # chain at well over one (figures and commands: docs/results.md, "CPU fast paths").
    # Served, the KV budget sizes the batch: each system gets the slots of engine.kv_cache_gb / 3 systems at
    # max_seq_len (SmolLM2's fp32 K/V is ~46 KB a token, ~0.05 GB a 1,024-token slot: ~27 slots each, at most
    # max_batch_size), so 16 or 32 clients decode together instead of queueing behind 4 rows.
    # The shipped drafters (v8 on) are trained over the full vocabulary; on this CPU they propose from the 8,000
    # tokens their training labels used most (engine.draft_vocab: the drafter's LM head reads 8,000 of 49,152 rows,
    # docs/results.md "A draft vocabulary at run time").
    cfg.engine = EngineConfig(max_batch_size=32, max_seq_len=1024, max_new_tokens=128, cpu_drafter_bf16=True,
                              ddtree_budget=4, kv_cache_gb=4.0, draft_vocab=8000)
    cfg.eval = EvalConfig(num_prompts=6)
    cfg.sweep = SweepConfig(num_samples=6)  # a CPU-sized sweep: 6 trials, then the best re-run over 3 seeds
    return cfg


# The packaged regenerated corpus (lilicorr/platform/corpus.py): the target's own greedy answers to ShareGPT prompts.
# Absolute, so the preset trains on it from any working directory (an export records it as corpora/..., export_paths).
SMOLLM2_CORPUS = str(REPO_ROOT / "corpora" / "smollm2-135m" / "sharegpt-v1")
SMOLLM2_CORPUS_V2 = str(REPO_ROOT / "corpora" / "smollm2-135m" / "sharegpt-v2")


def smollm2_135m_ship() -> Config:
    """The recipe of the drafters shipped under checkpoints/smollm2-135m/ (v6 on): smollm2-135m's model settings,
    trained on the packaged regenerated corpus (every answer the target's own greedy one, so slot k's label is what
    verification accepts after slots 1..k-1, not a human token), continued from the shipped drafters.
    `jobs/train_shipped.py` runs it (base, then each head for the same steps on the same data)."""
    cfg = smollm2_135m()
    cfg.preset = "smollm2-135m-ship"
    cfg.data = dataclasses.replace(cfg.data, output_dir=SMOLLM2_CORPUS)
    # v8 on: the full vocabulary, which vLLM's and SGLang's LiLiCorr require (v4-v7 proposed from 8,192 tokens).
    # The CPU engine restricts it at run time instead (engine.draft_vocab, models/vocab_ranking.py).
    cfg.drafter = dataclasses.replace(cfg.drafter, mask="learned", draft_vocab=0)
    # The corpus is read-only: its feature cache goes to outputs/. One worker holds the whole cache in memory.
    cfg.train = dataclasses.replace(cfg.train, feature_cache_dir="outputs/features", num_workers=1, epochs=100,
                                    checkpoint_every=25, validate_every=50, val_max_rows=48, log_every=5)
    # Continuing trained drafters: a lower drafter LR than from scratch, and WSD's final decay.
    cfg.optim = dataclasses.replace(cfg.optim, schedule="wsd", lr_drafter=3e-4, lr_head=5e-4, warmup_fraction=0.04)
    return cfg


def smollm2_135m_epoch() -> Config:
    """v9's first phase: each shipped drafter continued one epoch of sharegpt-v2 (4,000 rows x 4 per step = 1,000
    steps, each row once) with the cheap step measured on 2 cores (docs/results.md, "One epoch of sharegpt-v2"):
    an 8,192-token draft vocabulary (the drafter's LM head reads a sixth of the rows), bf16 autocast, the target
    run live each step (no feature cache to build or hold), in one process (`train.runner=local`)."""
    cfg = smollm2_135m_ship()
    cfg.preset = "smollm2-135m-epoch"
    cfg.data = dataclasses.replace(cfg.data, output_dir=SMOLLM2_CORPUS_V2)
    cfg.drafter = dataclasses.replace(cfg.drafter, draft_vocab=8192)
    cfg.train = dataclasses.replace(cfg.train, runner="local", precision="bf16", feature_cache=False, max_steps=1000,
                                    validate_every=100, checkpoint_every=50, log_every=10)
    return cfg


def smollm2_135m_finish() -> Config:
    """v9's second phase: the epoch's exports continued 25 steps over the full vocabulary, which vLLM's and SGLang's
    LiLiCorr require (the draft vocabulary is dropped on load: the LM head is the target's), at a third of the
    epoch's LR so that the short run adapts the drafter to the full softmax without undoing its WSD decay."""
    cfg = smollm2_135m_epoch()
    cfg.preset = "smollm2-135m-finish"
    cfg.drafter = dataclasses.replace(cfg.drafter, draft_vocab=0)
    cfg.train = dataclasses.replace(cfg.train, max_steps=25, validate_every=25, checkpoint_every=25, log_every=5)
    cfg.optim = dataclasses.replace(cfg.optim, lr_drafter=1e-4, lr_head=1.5e-4)
    return cfg


def smollm2_135m_fresh() -> Config:
    """v11 on: a shipped drafter continued one pass over the rows a corpus extension added, and only those
    (`python -m lilicorr.platform.corpus since NEW DEST --row <its first new source row>`, then
    `data.output_dir=DEST`): the epoch preset's step at the finish's LR, whose re-warm-up does not undo the
    annealed drafter (a second pass over old rows at 3e-4 first lost 0.1 validation τ; docs/results.md).
    One epoch of DEST's rows sizes the run. No finish run follows (it cost validation τ after this preset):
    `jobs/export.py --layout lilicorr --convert full-vocab` drops the draft vocabulary instead."""
    cfg = smollm2_135m_epoch()
    cfg.preset = "smollm2-135m-fresh"
    cfg.train = dataclasses.replace(cfg.train, epochs=1, max_steps=None, validate_every=50)
    cfg.optim = dataclasses.replace(cfg.optim, lr_drafter=1e-4, lr_head=1.5e-4)
    return cfg


def qwen3(size: str) -> Config:
    """Paper Table 4 settings on a Qwen3 target from the hub. The schema's defaults are Table 4's: 5 drafter
    layers, block 16, 512 anchors per sequence; head K=8, d_e=1024, σ=8, 2 layers, width 1024, 8 heads, FFN 2048;
    loss γ=0.25, λ=1 (margin variant: loss.mu=0.5, ρ=2); the optimiser; global batch 64, sequences of 3,072,
    6 epochs, ZeRO-2, bf16."""
    cfg = Config(preset=f"qwen3-{size}")
    cfg.target = TargetConfig(source=f"hf:Qwen/Qwen3-{size.upper()}", arch="qwen3", dtype="bfloat16",
                              eos_token_ids=[151645, 151643])
    cfg.drafter = DrafterConfig(mask_token_id=151669)
    cfg.train = TrainConfig(micro_batch=1, num_workers=8, use_gpu=True, checkpoint_every=1000, validate_every=1000,
                            val_max_rows=256, val_batch_size=2, max_failures=3)
    # Regeneration's static KV cache: Qwen3-4B/8B keep 36 layers x 2 (K, V) x 8 kv heads x 128 head_dim x 2 bytes
    # (bf16) = 147,456 bytes per token. Prompts <= 4096 + answers <= 4096 (+1), rounded up to 8,448 positions, x 32
    # rows = 39.9e9 bytes (37.1 GiB) beside the 16.4 GB Qwen3-8B: fits an 80 GB card. Unset, the cap would be the
    # 40,960-token context minus 4096: 32 x 40,960 x 147,456 = 193 GB.
    cfg.data = DataConfig(source="hf:nvidia/Nemotron-Post-Training-Dataset-v2", max_new_tokens=4096,
                          max_prompt_tokens=4096, rows_per_shard=2048, num_actors=8, batch_size=32, sort_window=16)
    # Serving: three systems (lilicorr, dflash, ar) at 32 x 8,192 would want 3 x ~40 GiB of static cache. 48 GiB
    # fits beside the target (15.3 GiB), two ~2 GB drafters and workspace on 80 GB. Per slot, a drafter system
    # costs (147,456 target + 5 drafter layers x 2 x 8 x 128 x 2 = 20,480) bytes x 8,209 positions (max_seq_len +
    # block + 1 of slack), AR 147,456 x 8,194: 3.97e9 bytes for the three, so 12 slots each (serve_apps/kv_budget.py).
    cfg.engine = EngineConfig(max_batch_size=32, max_seq_len=8192, max_new_tokens=2048, kv_cache_gb=48.0)
    return cfg


def qwen3_8b_debug() -> Config:
    """The qwen3-8b preset's scale-shaped twin (torchtitan's debug model): the same code paths, dtypes, vocabulary
    (151,936, Qwen3's tokenizer), block 16, K 8, anchor density, bf16 target, DeepSpeed bf16, ZeRO, micro-batch
    with accumulation and the mask token 151669, on a random Qwen3 target with tiny hidden sizes and layer
    counts. `make test` runs it regenerate -> train (2 Ray Train workers) -> validate -> export -> evaluate ->
    serve on the CPU (tests/pipeline/test_pipeline_scale.py): what keeps the cluster path from rotting."""
    cfg = qwen3("8b")
    cfg.preset = "qwen3-8b-debug"
    cfg.target = dataclasses.replace(
        cfg.target, source="random", vocab_size=151936, hidden_size=64, num_layers=8, num_heads=4, num_kv_heads=2,
        head_dim=16, intermediate_size=128, max_position_embeddings=4096, rope_theta=1e6, rms_norm_eps=1e-6,
        tie_word_embeddings=False, tokenizer="qwen3")
    # 2 drafter layers capture target layers 1 and 5 (L - 3); anchors at the paper's density (512 per 3,072
    # tokens = 1 per 6): 40 per 256-token row.
    cfg.drafter = dataclasses.replace(cfg.drafter, num_layers=2, anchors_per_seq=40)
    cfg.head = dataclasses.replace(cfg.head, embed_dim=32, width=32, num_heads=4, ffn_width=64,
                                   domino_gru_hidden=32, domino_mlp_hidden=32, dspark_rank=16)
    # 2 workers x micro-batch 1 x 2 accumulation steps = global batch 4; bf16 through DeepSpeed on CPU.
    cfg.train = dataclasses.replace(
        cfg.train, global_batch_size=4, micro_batch=1, seq_len=256, epochs=1, max_steps=2, num_workers=2,
        use_gpu=False, checkpoint_every=2, validate_every=2, val_max_rows=4, val_batch_size=2, max_failures=0,
        ce_chunk_rows=256)
    cfg.data = dataclasses.replace(cfg.data, source="embedded:sharegpt", limit=24, max_new_tokens=12,
                                   max_prompt_tokens=160, rows_per_shard=8, num_actors=1, batch_size=4, sort_window=2,
                                   heldout_fraction=0.25)
    cfg.engine = dataclasses.replace(cfg.engine, max_batch_size=2, max_seq_len=512, max_new_tokens=16, kv_cache_gb=None)
    cfg.eval = EvalConfig(num_prompts=2, speed_repeats=1)  # random weights: the speed cells only have to run
    return cfg


PRESETS: dict[str, Callable[[], Config]] = {
    "tiny-random": tiny_random,
    "smollm2-135m": smollm2_135m,
    "smollm2-135m-ship": smollm2_135m_ship,
    "smollm2-135m-epoch": smollm2_135m_epoch,
    "smollm2-135m-finish": smollm2_135m_finish,
    "smollm2-135m-fresh": smollm2_135m_fresh,
    "qwen3-4b": lambda: qwen3("4b"),
    "qwen3-8b": lambda: qwen3("8b"),
    "qwen3-8b-debug": qwen3_8b_debug,
}
