"""Per-GPU memory of one training step at paper scale, modelled (no GPU here): what `jobs/bench.py train-memory`
prints beside its CPU measurement, and the README's Qwen3-8B figure.

Parameter counts are exact: the drafter and head are built from the preset on the meta device (the real
modules, no memory). Everything else is arithmetic over the shapes, each term named after what holds it:
- target: the frozen bf16 weights (outside DeepSpeed, one copy per GPU), and its no-grad teacher-forced pass,
  which holds every layer's hidden states (output_hidden_states) until the captured ones are concatenated;
- DeepSpeed bf16 + ZeRO-2 over `world` ranks: bf16 parameters (replicated), fp32 master weights, Adam's two
  moments and the fp32 gradient partition (16 bytes / param / world), the bf16 gradient partition, and
  DeepSpeed's default reduce/all-gather buckets (5e8 elements each, bf16);
- drafter activations kept for backward, per sequence: per layer the block queries' (A x B tokens) hidden-sized
  tensors (norm inputs, q, attention output, o_proj, residuals: ~6 x H), the SwiGLU's 4 intermediate-sized ones,
  the K/V of context + block expanded to all heads (GQA repeat_interleave), the dense boolean mask; the fused
  context (fc input n x H per context token);
- head activations, per sequence: LiLiCorr's lattice (C x S x K nodes of width W through its transformer:
  ~6 W + 2 FFN per node per layer, plus node construction and the fuse / out / in projections ~8 W);
- the loss's chunk (models/slot_rows.py), transient, once: `ce_chunk_rows` x V x bytes per element (bf16
  logits and their gradient, fp32 log-softmax and softmax), more for heads that read the target's whole
  distribution or add a residual over V (Domino, DSpark).
Attention is taken to run in a fused (memory-efficient) kernel on GPU: no (queries x keys) score matrix is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
BF16 = 2
# Bytes per (row, vocabulary) element inside one loss chunk: bf16 logits + bf16 grad + fp32 log-softmax + fp32 softmax
# (the backward recomputes the chunk, so forward and backward never hold two chunks at once). Domino's corrected
# logits and DSpark's Markov-biased logits + target softmax add one more (r, V) logits/log-softmax pair.
CHUNK_BYTES_PER_ELEMENT = {"none": 12, "lilicorr": 12, "domino": 18, "dspark": 24}


def qwen3_8b_config():
    """The qwen3-8b preset with its target's real shape (gpu_decode.QWEN3_8B: random weights, no hub access)."""
    from lilicorr.bench.gpu_decode import QWEN3_8B
    from lilicorr.config import load_config

    return load_config("qwen3-8b", QWEN3_8B)


@dataclass
class MemoryEstimate:
    head: str
    world: int
    micro_batch: int
    parts_gb: dict  # name -> GB per GPU

    @property
    def total_gb(self) -> float:
        return sum(self.parts_gb.values())


def trainable_params(cfg) -> tuple[int, int]:
    """(drafter, head) parameter counts of the preset's modules, built on the meta device."""
    import torch

    from lilicorr.models.drafter import DFlashDrafter
    from lilicorr.models.heads import build_head
    from lilicorr.models.target import drafter_capture_ids, hf_config_from_target

    hf_cfg = hf_config_from_target(cfg.target)

    class _Shapes:  # what the drafter and heads read from a target adapter: shapes, never weights
        config = hf_cfg
        capture_ids = drafter_capture_ids(hf_cfg, cfg.drafter)

    with torch.device("meta"):
        drafter = DFlashDrafter(cfg.drafter, _Shapes)
        head = build_head(cfg, _Shapes, drafter)
    return (sum(p.numel() for p in drafter.parameters()), sum(p.numel() for p in head.parameters()))


def estimate(cfg, head: str, world: int, micro_batch: int = 1) -> MemoryEstimate:
    """The per-GPU step memory of `cfg` (a qwen3 preset with its real target shape) for one head kind."""
    import dataclasses

    cfg = dataclasses.replace(cfg, head=dataclasses.replace(cfg.head, kind=head))  # the caller's config untouched
    t, d, h = cfg.target, cfg.drafter, cfg.head
    P_d, P_h = trainable_params(cfg)
    P = P_d + P_h
    # target weights: embedding + LM head (untied in Qwen3-8B) + layers
    H, I, L = t.hidden_size, t.intermediate_size, t.num_layers
    attn = H * t.num_heads * t.head_dim * 2 + H * t.num_kv_heads * t.head_dim * 2 + 2 * t.head_dim
    target_params = t.vocab_size * H * (1 if t.tie_word_embeddings else 2) + L * (attn + 3 * H * I + 2 * H) + H
    T, A, B = cfg.train.seq_len, d.anchors_per_seq, d.block_size
    S, Q, n = B - 1, A * B, d.num_captured or d.num_layers
    kvd = t.num_kv_heads * t.head_dim
    per_layer = (6 * Q * H + 4 * Q * I + 2 * (T + Q) * t.num_heads * t.head_dim + 2 * (T + Q) * kvd) * BF16 + Q * (T + Q)
    drafter_acts = d.num_layers * per_layer + (T * n * H + 2 * T * H) * BF16
    rows = A * S
    if head == "lilicorr":
        nodes = rows * h.top_k
        head_acts = nodes * (h.num_layers * (6 * h.width + 2 * h.ffn_width) + 8 * h.width + 2 * h.embed_dim) * BF16
    elif head == "domino":
        head_acts = rows * (h.domino_gru_hidden * 3 + h.domino_mlp_hidden * 2 + H) * BF16
    elif head == "dspark":
        head_acts = rows * (h.dspark_rank * 2 + H) * BF16
    else:
        head_acts = 0
    chunk = min(cfg.train.ce_chunk_rows, rows) * t.vocab_size * CHUNK_BYTES_PER_ELEMENT[head]
    parts = {
        "target weights (bf16)": target_params * BF16 / GB,
        "target pass (no grad, transient)": micro_batch * (L + 1) * T * H * BF16 / GB,
        "drafter + head params (bf16)": P * BF16 / GB,
        "optimizer: fp32 master + Adam m, v + fp32 grads / world (ZeRO-2)": 16 * P / world / GB,
        "bf16 grad partition + DeepSpeed buckets": (P * BF16 / world + 2 * 5e8 * BF16) / GB,
        "drafter activations": micro_batch * drafter_acts / GB,
        "head activations": micro_batch * head_acts / GB,
        "loss chunk (transient)": chunk / GB,
    }
    return MemoryEstimate(head=head, world=world, micro_batch=micro_batch,
                          parts_gb={k: round(v, 2) for k, v in parts.items()})


def largest_micro_batch(cfg, head: str, world: int, gpu_gb: float = 80.0, reserve_gb: float = 4.0) -> int:
    """The largest micro-batch whose estimate fits `gpu_gb` with `reserve_gb` for the CUDA context and
    fragmentation (0 when even one sequence does not fit)."""
    micro = 0
    while estimate(cfg, head, world, micro + 1).total_gb <= gpu_gb - reserve_gb and micro < 64:
        micro += 1
    return micro
