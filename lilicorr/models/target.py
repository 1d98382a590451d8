"""The frozen target: a Hugging Face causal LM (Llama family incl. SmolLM2, or Qwen3) behind one adapter.

One teacher-forced pass gives everything training needs: the logits (supervision, target probabilities of
candidates, the target's greedy tokens) and the outputs of the captured layers (the drafter's context and
LiLiCorr's target state). The adapter also lends the target's input embedding and LM head, which the
drafter and heads share frozen. Loading real checkpoints is the platform's job; the adapter takes a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from lilicorr.config import TargetConfig
from lilicorr.config.choices import TARGET_ARCHS

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


def hf_config_from_target(cfg: TargetConfig):
    """A transformers config of the shape in `cfg` (random-init targets and meta-device builds)."""
    from transformers import LlamaConfig, Qwen3Config

    common = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings, rope_theta=cfg.rope_theta,
        rms_norm_eps=cfg.rms_norm_eps, tie_word_embeddings=cfg.tie_word_embeddings,
    )
    if cfg.arch not in TARGET_ARCHS:
        raise ValueError(f"unknown target arch {cfg.arch!r} (expected one of {', '.join(TARGET_ARCHS)})")
    config = (LlamaConfig if cfg.arch == "llama" else Qwen3Config)(**common)
    if cfg.yarn_factor is not None:
        from lilicorr.models.rope_config import extend_with_yarn

        extend_with_yarn(config, cfg.yarn_factor)
    return config


def build_random_target(cfg: TargetConfig):
    """A seeded random-init LlamaForCausalLM / Qwen3ForCausalLM of the configured shape, in eval mode."""
    from transformers import LlamaForCausalLM, Qwen3ForCausalLM

    hf_cfg = hf_config_from_target(cfg)
    cls = LlamaForCausalLM if cfg.arch == "llama" else Qwen3ForCausalLM
    fork_devices: list = []
    with torch.random.fork_rng(devices=fork_devices):  # seeded without disturbing the caller's RNG
        torch.manual_seed(cfg.seed)
        model = cls(hf_cfg)
    return model.to(torch_dtype(cfg.dtype)).eval()


def capture_layer_ids(num_target_layers: int, num_drafter_layers: int) -> list[int]:
    """DFlash rule: one captured target layer per drafter layer, evenly spaced from layer 1 to layer L-3.

    36 target layers, 5 drafter layers -> [1, 9, 17, 25, 33]. Tiny targets may repeat a layer (4 layers,
    2 drafter layers -> [1, 1]); that is what the rule gives and the fc layer copes with it.
    """
    if num_drafter_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, max(1, num_target_layers - 3)
    span = end - start
    return [int(round(start + i * span / (num_drafter_layers - 1))) for i in range(num_drafter_layers)]


def drafter_capture_ids(hf_config, drafter_cfg) -> list[int]:
    """The captured layers for a drafter config: `num_captured` of them (default: one per drafter layer)."""
    n = drafter_cfg.num_captured or drafter_cfg.num_layers
    return capture_layer_ids(hf_config.num_hidden_layers, n)


@dataclass
class TargetPass:
    """What training needs from the frozen target: computed live, or read back from the feature cache."""

    captured: torch.Tensor  # (N, T, n*H) concat of the captured layers' outputs
    final_hidden: torch.Tensor  # (N, T, H) the final-normed hidden state; logits = lm_head(final_hidden)


class TargetAdapter(nn.Module):
    """A frozen HF causal LM with the few entry points the drafter, heads and engine need."""

    def __init__(self, hf_model, capture_ids: list[int]):
        super().__init__()
        self.hf = hf_model
        self.hf.eval()
        for p in self.hf.parameters():
            p.requires_grad_(False)
        self.capture_ids = list(capture_ids)
        if self.capture_ids and max(self.capture_ids) >= self.num_layers - 1:
            # hidden_states[-1] is the final-normed output in HF, not the last layer's raw output.
            raise ValueError(f"capture ids {capture_ids} must stay below the last layer ({self.num_layers - 1})")

    def train(self, mode: bool = True):  # the target never leaves eval mode
        super().train(mode)
        self.hf.eval()
        return self

    @property
    def config(self):
        return self.hf.config

    @property
    def num_layers(self) -> int:
        return self.hf.config.num_hidden_layers

    @property
    def hidden_size(self) -> int:
        return self.hf.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.hf.config.vocab_size

    @property
    def num_captured(self) -> int:
        return len(self.capture_ids)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.hf.get_input_embeddings()(ids)

    @property
    def embed_weight(self) -> torch.Tensor:
        return self.hf.get_input_embeddings().weight  # (V, H), frozen

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.hf.get_output_embeddings().weight  # (V, H), frozen

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        # Frozen weights, but gradients still flow to `hidden` (the drafter trains through it).
        return self.hf.get_output_embeddings()(hidden)

    @torch.no_grad()
    def teacher_forced(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> TargetPass:
        # The base model, not the LM: logits are computed later only where they are needed (and the
        # feature cache stores exactly these two tensors).
        out = self.hf.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                                    use_cache=False)
        # hidden_states[0] is the embedding output; layer i's output is hidden_states[i + 1].
        captured = torch.cat([out.hidden_states[i + 1] for i in self.capture_ids], dim=-1)
        return TargetPass(captured=captured, final_hidden=out.last_hidden_state)
