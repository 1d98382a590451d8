"""The DFlash block drafter (docs/design.md §3): training form over many anchors, inference form over a KV cache.

No embedding or LM head of its own: callers embed block tokens with the target's frozen embedding and
project hidden states with the target's frozen LM head. A block is [anchor, MASK x (B-1)] at absolute
positions anchor..anchor+B-1; each block sees the fused target context strictly before its anchor
(the anchor's own target state does not exist yet at inference) and itself, bidirectionally.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from lilicorr.config import DrafterConfig
from lilicorr.config.choices import DRAFTER_MASKS
from lilicorr.kernels.linear import Projection
from lilicorr.models import drafter_fast
from lilicorr.models.drafter_layers import DrafterLayer, DrafterShape, RMSNorm


def _rope_theta(hf_config) -> float:
    params = getattr(hf_config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))


def drafter_shape_from_target(hf_config, num_layers: int, num_captured: int, qk_norm: bool = True) -> DrafterShape:
    """The drafter's layers take the target's shapes (as the released DFlash drafters do)."""
    return DrafterShape(
        hidden_size=hf_config.hidden_size,
        num_heads=hf_config.num_attention_heads,
        num_kv_heads=hf_config.num_key_value_heads,
        head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads,
        intermediate_size=hf_config.intermediate_size,
        rms_norm_eps=hf_config.rms_norm_eps,
        rope_theta=_rope_theta(hf_config),
        num_layers=num_layers,
        num_captured=num_captured,
        qk_norm=qk_norm,
    )


def not_drafted(dtype: torch.dtype) -> float:
    """The logit of tokens outside the draft vocabulary: far below any real logit, yet finite after the
    max-subtraction of a softmax (so log-probabilities stay finite and 0 * logp is 0, not nan)."""
    return torch.finfo(dtype).min / 4


def default_mask_token_id(vocab_size: int) -> int:
    # The last id of the vocabulary; real presets name an unused special id (Qwen3: 151669).
    return vocab_size - 1


class DFlashDrafter(nn.Module):
    """`target` gives shapes only (an adapter or anything with `.config` and `.capture_ids`); it is not stored."""

    def __init__(self, cfg: DrafterConfig, target):
        super().__init__()
        hf_config = target.config
        self.cfg = cfg
        self.shape = drafter_shape_from_target(hf_config, cfg.num_layers, len(target.capture_ids), cfg.qk_norm)
        self.capture_ids = list(target.capture_ids)
        self.block_size = cfg.block_size
        self.mask_token_id = cfg.mask_token_id if cfg.mask_token_id is not None else default_mask_token_id(hf_config.vocab_size)
        if cfg.mask not in DRAFTER_MASKS:
            raise ValueError(f"drafter.mask must be one of {', '.join(DRAFTER_MASKS)}, not {cfg.mask!r}")
        H = self.shape.hidden_size
        # The mask slots' input: a vector of the drafter's own (see DrafterConfig.mask). Small at init so the
        # slots start out driven by the context, not by one token's embedding through the tied LM head.
        self.mask_embedding = nn.Parameter(torch.zeros(H)) if cfg.mask == "learned" else None
        # Per-channel scale of the captured target states (DrafterConfig.feature_scaling): SmolLM2's residual
        # stream carries a few channels ~10^4 larger than the rest, which makes every fused context alike.
        # Not saved: `fold_feature_scale` moves it into fc.weight before export.
        self.register_buffer("feature_scale", torch.ones(self.shape.num_captured * H), persistent=False)
        self.fc = nn.Linear(self.shape.num_captured * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, self.shape.rms_norm_eps)
        self.layers = nn.ModuleList([DrafterLayer(self.shape) for _ in range(cfg.num_layers)])
        self.norm = RMSNorm(H, self.shape.rms_norm_eps)
        # Reduced draft vocabulary (DrafterConfig.draft_vocab, EAGLE-3 style): the token ids the drafter may
        # propose, ascending. Saved with the export; filled from training-data frequencies by `set_draft_vocab`.
        self.vocab_size = hf_config.vocab_size
        if cfg.draft_vocab:  # until set from data (or loaded): the first ids, a valid if arbitrary vocabulary
            self.register_buffer("draft_ids", torch.arange(cfg.draft_vocab, dtype=torch.long))
        else:
            self.draft_ids = None
        self.vocab_source = "default"  # "data" (set_draft_vocab) | "export" (JointModel.init_from_export) | "run-time"
        self._draft_weight = None  # (key, lm_weight rows of draft_ids): gathered once per weight tensor
        self.reset_parameters()

    def reset_parameters(self):
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        if self.mask_embedding is not None:
            nn.init.normal_(self.mask_embedding, std=0.02)

    def embed_blocks(self, anchor_ids: torch.Tensor, embed) -> torch.Tensor:
        """anchor_ids (...,) -> block inputs (..., B, H): the anchor's target embedding, then B-1 mask vectors.

        `embed` is the target's frozen input embedding (ids -> vectors).
        """
        a = embed(anchor_ids)  # (..., H)
        if self.mask_embedding is not None:
            m = self.mask_embedding.to(a.dtype)
        else:
            m = embed(torch.full((), self.mask_token_id, dtype=torch.long, device=anchor_ids.device))
        masks = m.expand(*a.shape[:-1], self.block_size - 1, a.shape[-1])
        return torch.cat([a.unsqueeze(-2), masks], dim=-2)

    @torch.no_grad()
    def set_feature_scale(self, channel_rms: torch.Tensor, keep_function: bool = False) -> None:
        """Scale captured channel j by 1 / rms_j (channel_rms (n*H,), measured on training data).

        keep_function=True when fc already holds trained weights (an export, whose scale was folded into fc,
        or any checkpoint): fc.weight is divided by the new scale so the drafter computes what it did.
        Without it a run started from an export would scale its inputs twice.
        """
        self.feature_scale.copy_(1.0 / channel_rms.to(self.feature_scale).clamp_min(1e-6))
        if keep_function:
            self.fc.weight.div_(self.feature_scale.to(self.fc.weight.dtype)[None, :])

    # ------------------------------------------------------------------ draft vocabulary

    @torch.no_grad()
    def set_draft_vocab(self, token_ids: torch.Tensor) -> None:
        """Restrict proposals to `token_ids` (draft_vocab distinct ids, e.g. the most frequent in training)."""
        ids = self._vocab_ids(token_ids, "set_draft_vocab")
        if self.draft_ids is None or ids.numel() != self.draft_ids.numel():
            raise ValueError(f"set_draft_vocab: {ids.numel()} distinct ids for drafter.draft_vocab="
                             f"{0 if self.draft_ids is None else self.draft_ids.numel()}")
        self.draft_ids.copy_(ids)
        self.vocab_source = "data"

    def _vocab_ids(self, token_ids: torch.Tensor, caller: str) -> torch.Tensor:
        """token_ids -> their distinct ids, ascending; ValueError naming `caller` for an id outside the vocabulary."""
        ids = torch.unique(token_ids.long())
        if int(ids[0]) < 0 or int(ids[-1]) >= self.vocab_size:
            raise ValueError(f"{caller}: ids must lie in [0, {self.vocab_size})")
        return ids

    @torch.no_grad()
    def use_draft_vocab(self, token_ids: torch.Tensor) -> None:
        """Inference only: a full-vocabulary drafter proposes from `token_ids` from now on (models/vocab_ranking.py,
        engine.draft_vocab). Not saved: the buffer is non-persistent, so an export of it stays full-vocabulary."""
        if self.draft_ids is not None:
            raise ValueError("use_draft_vocab: this drafter has a trained draft vocabulary already")
        ids = self._vocab_ids(token_ids, "use_draft_vocab")
        del self.draft_ids  # the plain None attribute, so that the name can become a buffer
        self.register_buffer("draft_ids", ids.to(self.fc.weight.device), persistent=False)
        self._draft_weight = None
        self.vocab_source = "run-time"

    def draft_lm_weight(self, lm_weight: torch.Tensor) -> torch.Tensor:
        """The target's LM head rows the drafter scores: (V, H), or (draft_vocab, H) with a draft vocabulary."""
        if self.draft_ids is None:
            return lm_weight
        return self._draft_rows(lm_weight, False).weight

    def _draft_rows(self, lm_weight: torch.Tensor, prepack: bool) -> Projection:
        # _version moves with every in-place write (set_draft_vocab, load_state_dict), so no manual reset
        key = (lm_weight.data_ptr(), lm_weight.dtype, lm_weight.device, self.draft_ids._version)
        if self._draft_weight is None or self._draft_weight[0] != key:
            rows = lm_weight.detach()[self.draft_ids.to(lm_weight.device)].contiguous()
            self._draft_weight = (key, Projection.of(rows))
        proj = self._draft_weight[1]
        if prepack and proj.packed is None:  # the engine's first call packs the gathered rows (once)
            proj.packed = Projection.of(proj.weight, None, prepack=True).packed
        return proj

    def logits(self, hidden: torch.Tensor, lm_weight: torch.Tensor, lm_head: Optional[Projection] = None) -> torch.Tensor:
        """hidden (..., H) -> logits (..., V) through the target's frozen LM head `lm_weight` (V, H).

        With a draft vocabulary only its rows are computed (V / draft_vocab times less work); the other
        tokens get NOT_DRAFTED, a finite floor (softmax 0, no inf/nan in entropies), so heads, top-K and
        sampling read full-vocabulary ids as before and never pick them.
        lm_head: the engine's projection of `lm_weight` (kernels/linear.py); its kernel choice (a packed
        oneDNN copy on CPU) carries over to the draft vocabulary's rows. None = F.linear (training).
        """
        if self.draft_ids is None:
            return F.linear(hidden, lm_weight) if lm_head is None else lm_head(hidden)
        small = self.draft_vocab_logits(hidden, lm_weight, lm_head)
        full = small.new_full((*small.shape[:-1], lm_weight.shape[0]), not_drafted(small.dtype))
        return full.index_copy(-1, self.draft_ids.to(small.device), small)

    def draft_vocab_logits(self, hidden: torch.Tensor, lm_weight: torch.Tensor,
                           lm_head: Optional[Projection] = None) -> torch.Tensor:
        """hidden (..., H) -> logits over the draft vocabulary only (..., draft_vocab), column j = token
        draft_ids[j]: what `logits` scatters into the full vocabulary. A head that takes vocab_ids
        (compact_vocab) reads these directly: no full-width floor, top-K or argmax over it."""
        if self.draft_ids is None:
            raise ValueError("draft_vocab_logits needs a draft vocabulary (drafter.draft_vocab > 0)")
        if lm_head is None:
            return F.linear(hidden, self.draft_lm_weight(lm_weight))
        return self._draft_rows(lm_weight, lm_head.packed is not None)(hidden)

    def draft_index(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Token ids -> their index in the draft vocabulary (rows of `draft_lm_weight`); meaningful only where
        `in_draft_vocab` (elsewhere a neighbour's index, for callers that mask those rows out)."""
        if self.draft_ids is None:
            return token_ids
        ids = self.draft_ids.to(token_ids.device)
        return torch.searchsorted(ids, token_ids.contiguous()).clamp_max(ids.numel() - 1)

    def restrict(self, logits: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits (..., V) with the tokens outside the draft vocabulary floored: a target's
        distribution renormalised over what the drafter can propose (its soft labels)."""
        if self.draft_ids is None:
            return logits
        keep = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        keep[self.draft_ids.to(logits.device)] = True
        return logits.masked_fill(~keep, not_drafted(logits.dtype))

    def in_draft_vocab(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Bool, same shape as token_ids: can the drafter propose this token?"""
        if self.draft_ids is None:
            return torch.ones_like(token_ids, dtype=torch.bool)
        return torch.isin(token_ids, self.draft_ids.to(token_ids.device))

    @property
    def hidden_size(self) -> int:
        return self.shape.hidden_size

    # ------------------------------------------------------------------ inference form (engine)

    def fuse_context(self, captured: torch.Tensor) -> torch.Tensor:
        """captured (C, T, n*H) -> ctx (C, T, H): (per-channel scale,) fc, then RMSNorm."""
        return self.hidden_norm(self.fc(captured * self.feature_scale.to(captured.dtype)))

    def project_context(self, ctx: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """ctx (C, T, H) at absolute `positions` (C, T) -> per layer (k, v), each (C, n_kv, T, hd), RoPE applied."""
        return [layer.self_attn.project_kv(ctx, positions) for layer in self.layers]

    def context(self, captured: torch.Tensor, positions: torch.Tensor,
                fast: Optional[drafter_fast.DrafterInference] = None
                ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """(fuse_context(captured) (C, T, H), project_context of it): the engine's context extension; given the
        engine's DrafterInference (its choice: engine/backend.py) one TorchScript call on CPU inference
        (drafter_fast.py), the modules otherwise."""
        if drafter_fast.usable(self, captured, fast):
            return drafter_fast.context(self, fast, captured, positions)
        ctx = self.fuse_context(captured)
        return ctx, self.project_context(ctx, positions)

    def forward_block(self, block_embeds, block_positions, ctx_kv, ctx_valid,
                      fast: Optional[drafter_fast.DrafterInference] = None) -> torch.Tensor:
        """One block per sequence over cached context.

        block_embeds (C, B, H), block_positions (C, B), ctx_kv per layer (k, v) (C, n_kv, Tc, hd),
        ctx_valid (C, Tc) bool -> final-normed hidden (C, B, H). The block attends bidirectionally to itself.
        fast: as in `context`.
        """
        if drafter_fast.usable(self, block_embeds, fast):  # the same ops in one TorchScript call (drafter_fast.py)
            return drafter_fast.block(self, fast, block_embeds, block_positions, ctx_kv, ctx_valid)
        C, B, _ = block_embeds.shape
        mask = torch.cat([ctx_valid[:, None, :].expand(C, B, -1),
                          torch.ones(C, B, B, dtype=torch.bool, device=block_embeds.device)], dim=2)
        return self._run(block_embeds, block_positions, ctx_kv, mask)

    def _run(self, x, positions, ctx_kv, mask):
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, positions, k, v, mask)
        return self.norm(x)

    # ------------------------------------------------------------------ training form

    def forward_train(self, captured, block_embeds, anchors) -> torch.Tensor:
        """Many blocks per sequence in one pass.

        captured (N, T, n*H) teacher-forced target states, block_embeds (N, A, B, H), anchors (N, A)
        -> hidden (N, A, B, H). Query i of block a sees context positions < anchors[a] and block a only.
        """
        N, A, B, H = block_embeds.shape
        T = captured.shape[1]
        ctx = self.fuse_context(captured)
        ctx_pos = torch.arange(T, device=captured.device).expand(N, T)
        ctx_kv = self.project_context(ctx, ctx_pos)
        positions = (anchors[:, :, None] + torch.arange(B, device=anchors.device)).reshape(N, A * B)
        mask = training_block_mask(anchors, B, T)
        hidden = self._run(block_embeds.reshape(N, A * B, H), positions, ctx_kv, mask)
        return hidden.view(N, A, B, H)


def training_block_mask(anchors: torch.Tensor, block_size: int, ctx_len: int) -> torch.Tensor:
    """Dense boolean mask (N, A*B, T + A*B): block a's queries see ctx keys < anchor_a and block a's keys.

    Blocks never see each other, even when anchors lie closer together than B (the known leak of one
    implementation), because block membership, not position, decides the block part.
    """
    N, A = anchors.shape
    B = block_size
    q_anchor = anchors.repeat_interleave(B, dim=1)  # (N, A*B)
    ctx_ok = torch.arange(ctx_len, device=anchors.device)[None, None, :] < q_anchor[:, :, None]  # (N, A*B, T)
    block_of = torch.arange(A, device=anchors.device).repeat_interleave(B)  # (A*B,)
    same_block = (block_of[:, None] == block_of[None, :]).expand(N, A * B, A * B)
    return torch.cat([ctx_ok, same_block], dim=2)
