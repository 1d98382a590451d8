"""One typed config for every job (pure Python: models/engine import it too), with named presets and `section.field=value` overrides.

    cfg = load_config("smollm2-135m", ["head.top_k=4", "train.max_steps=50"])

Presets are plain functions returning a `Config` (torchtitan style). `tiny-random` builds a
random-init target of a few MB for tests; `smollm2-135m` is the embedded default that runs on a
laptop; `qwen3-4b` / `qwen3-8b` carry the paper's Table 4 values.

This module is pure Python (no torch, no Ray) so a bad flag fails in well under 2 s.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from lilicorr.config_choices import (ConfigError, DecodeRule, DrafterInit, DrafterMask, DSparkProposal,
                                     FeatureDType, GenerateBackend, HeadKind, LiLiCorrEmbed, LiLiCorrFeatureNorm,
                                     LiLiCorrInit, LiLiCorrPartial, LiLiCorrTarget, Precision, Schedule,
                                     SweepScheduler, SweepSearch, SystemName, TargetArch, TargetDType,
                                     TrainLabels, check_choices, sections, set_key)


@dataclass
class TargetConfig:
    """The frozen target model.

    `source` says where weights come from:
      - "embedded:smollm2-135m"  the packaged SmolLM2-135M-Instruct (converted once into the cache)
      - "hf:<repo id>"           a Hugging Face hub model, e.g. "hf:Qwen/Qwen3-8B" (needs network)
      - "local:<dir>"            a folder with config.json + safetensors + tokenizer files
      - "random"                 random init of the shape below (tests, GPU timing)
    """

    source: str = "random"
    arch: TargetArch = "llama"  # Llama family (incl. SmolLM2) or Qwen3
    dtype: TargetDType = "float32"
    # Shape; used only when source == "random" (otherwise read from the checkpoint).
    vocab_size: int = 49152  # SmolLM2 tokenizer size, so tiny-random runs real text too
    hidden_size: int = 64
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 128
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    seed: int = 0
    # Chat / stop handling. None = take from the tokenizer.
    eos_token_ids: Optional[list[int]] = None
    enable_thinking: bool = False  # Qwen3 chat template; the paper disables reasoning


@dataclass
class DrafterConfig:
    """The DFlash block drafter (DESIGN.md §3)."""

    num_layers: int = 5
    block_size: int = 16  # B: anchor + (B-1) speculative slots
    mask_token_id: Optional[int] = None  # only for mask="token": None = the vocabulary's last id
    # "learned": the drafter owns the mask slots' input vector (a tied-embedding target like SmolLM2 has no
    # unused row: a real token there makes 98% of slots predict that token at init). "token": the embedding
    # of mask_token_id (public DFlash checkpoints, Qwen3's unused id 151669).
    mask: DrafterMask = "learned"
    num_captured: Optional[int] = None  # target layers captured (spread 1..L-3); None = one per drafter layer
    feature_scaling: bool = False  # divide captured states by their per-channel RMS (folded into fc at export)
    init: DrafterInit = "random"  # "target_top": copy the target's top layers (same shapes)
    qk_norm: bool = True  # q/k RMSNorms in attention (Qwen3, public DFlash); False = Llama's layout (SmolLM2)
    # Reduced draft vocabulary (EAGLE-3 style): propose only the draft_vocab most frequent training tokens,
    # so the drafter's LM head and CE cost draft_vocab / V of the full ones. 0 = the target's whole vocabulary.
    draft_vocab: int = 0
    checkpoint: Optional[str] = None  # public DFlash checkpoint (folder or hub id) to start from
    loss_decay_beta: float = 7.0  # β of Eq. 6
    anchors_per_seq: int = 512  # training blocks per sequence (paper scale)


@dataclass
class HeadConfig:
    """The speculative head on top of the drafter. `kind` switches between systems."""

    kind: HeadKind = "lilicorr"  # "none" = vanilla DFlash
    # LiLiCorr (Table 4)
    top_k: int = 8  # K
    embed_dim: int = 1024  # d_e, in/out vector size
    sigma: float = 8.0  # cosine scale σ of Eq. 1
    num_layers: int = 2
    width: int = 1024
    num_heads: int = 8
    ffn_width: int = 2048
    decode_rule: DecodeRule = "greedy"  # "greedy" (Eq. 8) | "viterbi" (App. E)
    # Domino (DESIGN.md §4)
    domino_gru_hidden: int = 1024
    domino_mlp_hidden: int = 256
    # DSpark (DESIGN.md §4)
    dspark_rank: int = 256
    dspark_threshold: float = 0.5
    dspark_proposal: DSparkProposal = "deterministic"
    # LiLiCorr choices the paper leaves open (issue 16): ours first, then NVIDIA Model-Optimizer's plugin.
    # Defaults: Model-Optimizer's unless ours trains measurably better on lilicorr/platform/ablate_head.py's
    # learning curves (figures in the head's module doc): only the init is ours (6 seeds, paired t = 2.5).
    lilicorr_embed: LiLiCorrEmbed = "raw"  # candidate embedding: "rms" (RMS-normalised) | "raw" (frozen, as is)
    lilicorr_feature_norm: LiLiCorrFeatureNorm = "layernorm"  # 5 confidence features: "none" | "layernorm"
    lilicorr_init: LiLiCorrInit = "torch"  # head Linears: "torch" (PyTorch default) | "normal" (N(0, 0.02), bias 0)
    lilicorr_target: LiLiCorrTarget = "fused"  # "mean" (captured layers -> RMSNorm -> Linear) | "fused" (drafter fc+norm)
    lilicorr_partial: LiLiCorrPartial = "drop"  # partly masked block: "cut" at the first invalid slot | "drop" it


@dataclass
class LossConfig:
    """Weights of Eq. 7 and of the margin variant (App. G)."""

    gamma: float = 0.25  # γ, reranker objective weight
    lam: float = 1.0  # λ, distractor penalty weight
    mu: float = 0.0  # μ, margin blend; 0 = plain Eq. 7, 0.5 = "LiLiCorr + margin"
    rho: float = 2.0  # ρ, hinge margin of Eq. 13


@dataclass
class OptimConfig:
    """Table 4 optimiser: two parameter groups, AdamW, cosine with warmup."""

    lr_drafter: float = 6e-4
    lr_head: float = 1.5e-4
    weight_decay_drafter: float = 0.0
    weight_decay_head: float = 0.01
    warmup_fraction: float = 0.04
    schedule: Schedule = "cosine"  # linear warmup, then cosine to 0, constant, or wsd (constant, then linear to 0)
    decay_fraction: float = 0.2  # wsd: the last fraction of the steps over which the LR falls to 0
    grad_clip: float = 1.0
    betas: tuple[float, float] = (0.9, 0.95)


@dataclass
class TrainConfig:
    global_batch_size: int = 64
    micro_batch: Optional[int] = None  # rows/worker/forward; None = global / workers; else accumulated (config_rules)
    seq_len: int = 3072
    epochs: int = 6
    max_steps: Optional[int] = None  # cap on optimizer steps (small budgets)
    num_workers: int = 1
    use_gpu: bool = False
    zero_stage: int = 2
    precision: Precision = "bf16"  # "bf16" (fp32 master weights) | "fp32"
    checkpoint_every: int = 500
    max_failures: int = 0  # worker-group restarts from the last checkpoint (Ray Train FailureConfig)
    validate_every: int = 500
    seed: int = 0
    output_dir: str = "outputs/train"
    log_every: int = 10  # a progress line (step, loss terms, lr, tokens/s) every N optimizer steps
    val_max_rows: Optional[int] = None  # held-out rows per validation, total over workers (lowest id hashes)
    val_batch_size: int = 8  # held-out rows per validation forward (no grad; rows of one batch share an anchor count)
    shuffle_rows: int = 16384  # rows a worker permutes together per epoch (seeded by seed, epoch: data.shuffled_rows)
    fail_at_step: Optional[int] = None  # test hook: rank 1 exits once at this step (fault-tolerance test)
    labels: TrainLabels = "target"  # each slot's label: the target's greedy token (what verification accepts) | "corpus"
    distill: float = 0.0  # weight of soft-label CE against the target's distribution (1 - distill on the label)
    feature_cache: bool = False  # train from cached target states (built once by a Ray Data stage if missing)
    feature_dtype: FeatureDType = "bfloat16"  # storage dtype of cached states ("float32" for exact equivalence)
    ce_chunk_rows: int = 2048  # (block, slot) rows per checkpointed LM-head + CE chunk
    init_from: Optional[str] = None  # start drafter + head from another export (e.g. LiLiCorr on a DFlash drafter)
    cpu_threads: Optional[int] = None  # torch threads per CPU worker; None = the node's cores / its workers


@dataclass
class DataConfig:
    source: str = "embedded:sharegpt"  # "embedded:sharegpt" | "hf:<id>" | path to .jsonl/.parquet
    limit: Optional[int] = None  # conversations to read
    heldout_fraction: float = 0.05
    max_new_tokens: int = 4096  # cap per regenerated assistant turn
    max_prompt_tokens: Optional[int] = None  # None = target context minus the cap
    rows_per_shard: int = 256
    num_actors: int = 1
    batch_size: int = 8  # prompts per generate call (the decoder's static-cache rows)
    # Length grouping: an actor call takes up to sort_window x batch_size conversations of one shard, and each
    # turn's prompts among them are sorted by token length before they are cut into generate batches, so a long
    # prompt is padded beside long ones. 1 = no sorting. Keep rows_per_shard a multiple of the call size: calls
    # then never straddle shards and a resumed run sees the same groups (the same outputs) as a clean one.
    sort_window: int = 8
    # A rerun regenerates the finished shards whose rows a failed generate call skipped (e.g. CUDA OOM at
    # this batch_size); False = finished shards stay as written (the failures counted in the manifest).
    retry_failed: bool = False
    fail_row: Optional[int] = None  # test hook: a generate call holding this source row raises (as an OOM would)
    output_dir: str = "outputs/regenerated"
    generate_backend: GenerateBackend = "engine"  # "engine" (batched AR decoder) | "hf" (transformers generate, one by one)
    use_gpu: Optional[bool] = None  # one GPU per generator actor; None = if the cluster has GPUs at start


@dataclass
class EngineConfig:
    system: SystemName = "lilicorr"  # jobs/generate.py's --system when not given
    max_batch_size: int = 8
    max_seq_len: int = 4096
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int = 0
    use_triton: bool = True  # on CUDA; CPU always uses the torch reference
    cuda_graphs: bool = True
    cpu_gemv: bool = True  # fp32 CPU batch-1 steps: each layer one compiled call (engine/one_row_layer.py), LM head via kernels/gemv.py
    max_waiting: int = 64  # queued requests beyond the running slots; add_request raises QueueFull past it
    prefill_token_budget: int = 512  # prompt tokens prefilled per step (long prompts span steps); 0 = no limit
    ddtree_budget: int = 0  # DDTree: draft nodes per tree (0 = 2 x the drafter's slots)
    ddtree_top_k: int = 4  # DDTree: candidates kept per slot
    # KV-cache budget in GiB (2^30 bytes) shared by the systems one Serve replica runs side by side (target +
    # drafter caches of every system, serve_apps/kv_budget.py): each keeps max_seq_len and gets the same number of
    # slots, max_batch_size or fewer, so that the sum fits. None = every system its full max_batch_size cache.
    kv_cache_gb: Optional[float] = None


@dataclass
class EvalConfig:
    benchmarks: list[str] = field(default_factory=lambda: ["mt-bench", "humaneval"])
    num_prompts: Optional[int] = None
    output_dir: str = "outputs/eval"


@dataclass
class TrackingConfig:
    tracking_uri: Optional[str] = None  # None = $MLFLOW_TRACKING_URI or sqlite:///mlruns.db
    experiment: str = "lilicorr"


@dataclass
class DemoConfig:
    budget: float = 1.0  # scales the demo's data and steps; 1.0 fits ~30 min on a 2-core CPU


@dataclass
class SweepConfig:
    """Ray Tune sweeps over training settings (jobs/sweep.py, lilicorr/platform/sweep).

    `space` entries are command-line overrides with several values: "section.field=v1|v2|v3" (grid
    values, or random choices), or "section.field=uniform:lo:hi" | "loguniform:lo:hi" | "randint:lo:hi"
    (random search only). Every value passes the same check as a `section.field=value` override.
    """

    space: list[str] = field(default_factory=lambda: [
        "loss.gamma=0.1|0.25|0.5|1.0", "loss.lam=0|0.5|1|2", "loss.mu=0|0.5", "loss.rho=1|2|4"])
    search: SweepSearch = "random"  # "grid" (every combination, num_samples times over) | "random"
    num_samples: int = 8  # random: trials; grid: repeats of the whole grid
    scheduler: SweepScheduler = "asha"  # "asha" (stops weak trials early, on training steps) | "none"
    metric: str = "val_sim_acceptance_length"  # validation τ (maximised); never the loss
    grace_period: Optional[int] = None  # ASHA: steps before a trial may stop; None = train.validate_every
    reduction_factor: int = 2  # ASHA: keep 1/rf of trials at each rung
    top_k: int = 1  # stage two: the best configs re-run with every seed below, no early stopping
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])  # stage two / ablation seeds ([] = no stage two)
    max_concurrent_trials: int = 1  # on 2 CPU cores one trial's Train workers take both
    search_seed: int = 0  # random search draws
    output_dir: str = "outputs/sweep"  # Tune state, one folder per trial, best_config.yaml
    name: Optional[str] = None  # sweep (Tune experiment, MLflow parent run); None = sweep-<preset>-<hash>


@dataclass
class Config:
    preset: str = "tiny-random"
    target: TargetConfig = field(default_factory=TargetConfig)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    demo: DemoConfig = field(default_factory=DemoConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def flat(self) -> dict[str, Any]:
        """{"section.field": value}: what MLflow records as params."""
        out: dict[str, Any] = {"preset": self.preset}
        for section in sections(self):
            for f in dataclasses.fields(getattr(self, section)):
                out[f"{section}.{f.name}"] = getattr(getattr(self, section), f.name)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Config":
        cfg = cls(preset=d.get("preset", "custom"))
        for section in sections(cfg):
            for key, value in d.get(section, {}).items():
                set_key(cfg, f"{section}.{key}", value)
        return cfg


# ----------------------------------------------------------------------------- presets


def tiny_random() -> Config:
    """A random-init target of a few MB and a matching small head: for tests on CPU.

    Llama-shaped by default; `target.arch=qwen3` gives the Qwen3 shape (q/k norms).
    """
    cfg = Config(preset="tiny-random")
    cfg.target = TargetConfig(source="random", arch="llama")
    cfg.drafter = DrafterConfig(num_layers=2, block_size=4, anchors_per_seq=8)
    cfg.head = HeadConfig(top_k=3, embed_dim=32, num_layers=2, width=32, num_heads=4, ffn_width=64,
                          domino_gru_hidden=32, domino_mlp_hidden=32, dspark_rank=16)
    cfg.train = TrainConfig(global_batch_size=4, seq_len=64, epochs=1, max_steps=20, zero_stage=0,
                            precision="fp32", checkpoint_every=10, validate_every=10)
    cfg.data = DataConfig(limit=16, max_new_tokens=16, rows_per_shard=4, batch_size=4)
    cfg.engine = EngineConfig(max_batch_size=8, max_seq_len=256, max_new_tokens=24)
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
    cfg.engine = EngineConfig(max_batch_size=4, max_seq_len=1024, max_new_tokens=128)
    cfg.eval = EvalConfig(num_prompts=6)
    cfg.sweep = SweepConfig(num_samples=6)  # a CPU-sized sweep: 6 trials, then the best re-run over 3 seeds
    return cfg


def _qwen3(size: str) -> Config:
    """Paper Table 4 settings on a Qwen3 target from the hub."""
    cfg = Config(preset=f"qwen3-{size}")
    cfg.target = TargetConfig(source=f"hf:Qwen/Qwen3-{size.upper()}", arch="qwen3", dtype="bfloat16",
                              eos_token_ids=[151645, 151643])
    cfg.drafter = DrafterConfig(num_layers=5, block_size=16, mask_token_id=151669, anchors_per_seq=512)
    cfg.head = HeadConfig()  # Table 4: K=8, d_e=1024, σ=8, 2 layers, width 1024, 8 heads, FFN 2048
    cfg.loss = LossConfig()  # γ=0.25, λ=1; margin variant: loss.mu=0.5 (ρ=2)
    cfg.optim = OptimConfig()
    cfg.train = TrainConfig(global_batch_size=64, micro_batch=1, seq_len=3072, epochs=6, num_workers=8, use_gpu=True,
                            zero_stage=2, precision="bf16", checkpoint_every=1000, validate_every=1000,
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


def qwen3_4b() -> Config:
    return _qwen3("4b")


def qwen3_8b() -> Config:
    return _qwen3("8b")


PRESETS: dict[str, Callable[[], Config]] = {
    "tiny-random": tiny_random,
    "smollm2-135m": smollm2_135m,
    "qwen3-4b": qwen3_4b,
    "qwen3-8b": qwen3_8b,
}


# ----------------------------------------------------------------------------- overrides


def load_config(preset: str, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """The named preset with `section.field=value` overrides applied, each checked."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; known presets: {', '.join(PRESETS)}")
    cfg = PRESETS[preset]()
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form section.field=value")
        key, raw = item.split("=", 1)
        set_key(cfg, key.strip(), raw)
    check_choices(cfg)
    from lilicorr.config_rules import check_rules  # cross-field rules (here: config_rules reads config's types)
    check_rules(cfg)
    return cfg
