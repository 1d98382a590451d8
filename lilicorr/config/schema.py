"""The config's schema: one dataclass per section and `Config`, which holds them (pure Python: models and
engine read it too). Presets (presets.py) build these; load.py applies overrides and checks the result.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Optional

from lilicorr.config.choices import (CpuOneRow, DecodeRule, DrafterInit, DrafterMask, DSparkProposal, EngineBackend,
                                     FeatureDType, GenerateBackend, HeadKind, LiLiCorrEmbed, LiLiCorrFeatureNorm,
                                     LiLiCorrInit, LiLiCorrNormEps, LiLiCorrPartial, LiLiCorrSlotBias, LiLiCorrTarget,
                                     Precision, RandomTokenizer, RegenerateRunner, Schedule, SweepScheduler,
                                     SweepSearch, SystemName, TargetArch, TargetDType, TrainLabels, TrainRunner)
from lilicorr.config.overrides import sections, set_key


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
    tokenizer: RandomTokenizer = "smollm2"  # random targets only: SmolLM2's (vocab >= 49,152) or Qwen3's (>= 151,669)
    # Chat / stop handling. None = take from the tokenizer.
    eos_token_ids: Optional[list[int]] = None
    enable_thinking: bool = False  # Qwen3 chat template; the paper disables reasoning
    # YaRN context extension at inference (paper §4.3.1): F > 1 serves F x the checkpoint's max_position_embeddings
    # with rope_type "yarn", factor F, original_max_position_embeddings = the checkpoint's (engine/rope.py computes it
    # as transformers does). None = the checkpoint's own RoPE; a prompt past its positions is then refused.
    yarn_factor: Optional[float] = None


@dataclass
class DrafterConfig:
    """The DFlash block drafter (docs/design.md §3)."""

    num_layers: int = 5
    block_size: int = 16  # B: anchor + (B-1) speculative slots
    mask_token_id: Optional[int] = None  # only for mask="token": None = the vocabulary's last id
    # "learned": the drafter owns the mask slots' input vector (a tied-embedding target like SmolLM2 has no
    # unused row: a real token there makes nearly every slot predict that token at init; docs/results.md, "Drafter
    # inputs"). "token": the embedding of mask_token_id (public DFlash checkpoints, Qwen3's unused id 151669).
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
    # Domino (docs/design.md §4)
    domino_gru_hidden: int = 1024
    domino_mlp_hidden: int = 256
    # DSpark (docs/design.md §4)
    dspark_rank: int = 256
    dspark_threshold: float = 0.5
    dspark_proposal: DSparkProposal = "deterministic"
    # LiLiCorr choices the paper leaves open (issue 16): ours first, then NVIDIA Model-Optimizer's plugin.
    # Defaults: Model-Optimizer's unless ours trains measurably better on jobs/ablate_head.py's learning
    # curves (docs/results.md): only the init is ours.
    lilicorr_embed: LiLiCorrEmbed = "raw"  # candidate embedding: "rms" (RMS-normalised) | "raw" (frozen, as is)
    lilicorr_feature_norm: LiLiCorrFeatureNorm = "layernorm"  # 5 confidence features: "none" | "layernorm"
    lilicorr_init: LiLiCorrInit = "torch"  # head Linears: "torch" (PyTorch default) | "normal" (N(0, 0.02), bias 0)
    lilicorr_target: LiLiCorrTarget = "fused"  # "mean" (captured -> RMSNorm -> Linear) | "fused" (drafter fc+norm)
    lilicorr_partial: LiLiCorrPartial = "drop"  # partly masked block: "cut" at the first invalid slot | "drop" it
    # Two more where vLLM's LiLiCorrHead (the production engines' reference) computes otherwise (issue 39 item 2):
    # its choice by default, so that an export serves as trained (docs/vllm-lilicorr.md has the before/after τ).
    lilicorr_slot_bias: LiLiCorrSlotBias = "shared"  # lattice attention biases: "per_layer" | "shared" by all layers
    lilicorr_norm_eps: LiLiCorrNormEps = "drafter"  # head RMSNorms: "fixed" 1e-6 | "drafter" (its rms_norm_eps)


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
    # drafter layers that train.init_from adds as the identity (a deeper drafter than the export): their output
    # projections start at zero, and at a continuation's low LR they stay near it; None = lr_drafter
    lr_grown: Optional[float] = None
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
    micro_batch: Optional[int] = None  # rows/worker/forward; None = global / workers; else accumulated (rules.py)
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
    labels: TrainLabels = "target"  # each slot's label: the target's greedy token (what is accepted) | "corpus"
    distill: float = 0.0  # weight of soft-label CE against the target's distribution (1 - distill on the label)
    feature_cache: bool = False  # train from cached target states (built once by a Ray Data stage if missing)
    feature_dtype: FeatureDType = "bfloat16"  # storage dtype of cached states ("float32" for exact equivalence)
    # where the cache is built: None = beside the shards (data.output_dir); a packaged corpus is read-only, so
    # training on one puts its cache here instead (the smollm2-135m preset: outputs/features)
    feature_cache_dir: Optional[str] = None
    ce_chunk_rows: int = 2048  # (block, slot) rows per checkpointed LM-head + CE chunk
    init_from: Optional[str] = None  # start drafter + head from another export (e.g. LiLiCorr on a DFlash drafter)
    cpu_threads: Optional[int] = None  # torch threads per CPU worker; None = the node's cores / its workers
    # "ray": Ray Train workers with DeepSpeed; "local": the same loop in this process on one device (a GPU machine
    # with torch alone), plain AdamW, bf16 as autocast, checkpoints under <output_dir>/local (train/local.py)
    runner: TrainRunner = "ray"


@dataclass
class DataConfig:
    source: str = "embedded:sharegpt"  # "embedded:sharegpt" | "hf:<id>" | path to .jsonl/.parquet
    limit: Optional[int] = None  # conversations to read (source rows [start_row, limit))
    # First source row regenerated (a multiple of rows_per_shard): the shards before it are not made, so a run can
    # regenerate the rows after a packaged corpus's and `python -m lilicorr.platform.corpus extend` adds them to it.
    start_row: int = 0
    max_turns: Optional[int] = None  # assistant turns regenerated per conversation; None = all, 1 = first turns only
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
    generate_backend: GenerateBackend = "engine"  # "engine" (batched AR decoder) | "hf" (transformers, one by one)
    # | "vllm" (Ray Data LLM's vLLM processor on GPU nodes: data.num_actors engines of vllm_tensor_parallel GPUs each,
    # data.batch_size requests per engine call; regenerate/vllm_processor.py)
    vllm_tensor_parallel: int = 1  # GPUs per vLLM engine (its tensor_parallel_size)
    # Shards regenerated together by the vllm backend: each assistant turn of all their conversations is one Ray Data
    # LLM pass, and each pass starts its engines afresh (Ray Data keeps no actor between datasets), so more shards
    # per wave = fewer engine starts, fewer = less work lost to a kill (finished waves' shards are skipped on resume).
    vllm_wave_shards: int = 4
    use_gpu: Optional[bool] = None  # one GPU per generator actor; None = if the cluster has GPUs at start
    # "ray": Ray Data actors (a cluster, or a local Ray); "local": this process regenerates the shards one after
    # another on its own device (a single GPU machine without Ray; the same shards, resume and outputs)
    runner: RegenerateRunner = "ray"


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
    # Which implementation runs each computation (engine/backend.py, resolved once per decoder and recorded in
    # the benches' and the evaluation's output): "auto" = the levers below where they can run here, else the next
    # path down with a note; "fast" = the same, but a lever's path that cannot run raises; "reference" = the
    # eager references (layers, F.linear, the drafter's modules, torch kernels, no CUDA graphs)
    backend: EngineBackend = "auto"
    use_triton: bool = True  # on CUDA; CPU always uses the torch reference
    cuda_graphs: bool = True
    # fp32 CPU steps of 2+ rows (verification, batched decoding, prefill, the drafter's block): oneDNN on weights
    # packed once (kernels/packed_linear.py), far faster than MKL's small-M GEMMs here (docs/results.md); costs 1x
    # the weights' memory again
    cpu_prepack: bool = True
    # fp32 CPU steps of one row's one token (batch-1 decoding) with cpu_prepack: which copy of the weights the
    # target's projections and LM head multiply by. Which is faster depends on the host's MKL and oneDNN builds, so
    # "measure" times both on the target's own weights when the decoder is built (once per process and target) and
    # takes the faster; "plain" = F.linear on the plain weights (MKL's GEMV), "packed" = the packed copies
    cpu_one_row: CpuOneRow = "measure"
    # fp32 CPU steps other than one row's one token: the target's layers in one TorchScript call (the same ops
    # without Python's per-op cost, engine/scripted_stack.py); false = the eager layers
    cpu_script_layers: bool = True
    # fp32 CPU targets: the drafter (and its context cache) in bf16 on oneDNN where the CPU has bf16 instructions
    # (half the bytes its small-M GEMMs read). Drafts may differ by bf16 rounding; the target stays fp32, so
    # decoding stays lossless. Heads and the drafter's LM head (the target's rows) stay in the target's dtype.
    cpu_drafter_bf16: bool = False
    # CPU inference, one greedy fp32 row: the LiLiCorr head's proposal (top-K, vectors, walk) in one C call
    # (kernels/native/lilicorr_head.c, built with the machine's C compiler on first use); false, or no compiler = the
    # head's modules, which 2+ rows run
    cpu_native_head: bool = True
    max_waiting: int = 64  # queued requests beyond the running slots; add_request raises QueueFull past it
    prefill_token_budget: int = 512  # prompt tokens prefilled per step (long prompts span steps); 0 = no limit
    # Verify only the first k drafted slots of a block (1 <= k <= block - 1; 0 = all of them): on a slow verifier
    # a shorter verification can pay more than the drafts it gives up (jobs/bench.py vllm --draft-tokens). Chains only.
    # The drafter's block still runs whole; its LM head and the spec head compute only the first k slots.
    draft_tokens: int = 0
    # A full-vocabulary drafter proposes from at most N tokens, its export's most frequent training labels
    # (models/vocab_ranking.py): its LM head reads N of the target's V rows per slot. Drafts may change, decoding
    # stays lossless. 0 = the vocabulary it was trained with; where it cannot apply (a trained draft vocabulary,
    # a random drafter, no ranking) the drafter keeps its own and the plan's `draft_vocab` says why.
    draft_vocab: int = 0
    # Adaptive verification length (engine/adaptive_draft.py): per block and row, verify the drafts while the running
    # product of the drafter's top-1 probabilities stays >= this (at least 1, at most draft_tokens or the block's);
    # the target's pass holds the longest row's. 0 = off. Chains only; lossless at every temperature.
    adaptive_draft_survival: float = 0.0
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
    # interleaved rounds over each setting's prompts (evaluate/cells.py): tokens/s and the speedup's interval
    # pool every round; τ and outputs come from the first
    speed_repeats: int = 2
    # mt-bench-turn2: the target's own greedy answer to turn 1 (generated at evaluation time) is cut at this many tokens
    turn1_max_tokens: int = 256


@dataclass
class TrackingConfig:
    tracking_uri: Optional[str] = None  # None = $MLFLOW_TRACKING_URI or sqlite:///mlruns.db
    experiment: str = "lilicorr"


@dataclass
class DemoConfig:
    budget: float = 0.25  # scales data, steps, prompts (jobs/demo.py); 0.25 fits 10 min on 2 CPU cores


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

