"""Small random targets whose greedy output is not degenerate, for the engine tests (imported as `engine_helpers`).

HF's default init (std 0.02, tied embeddings) makes a tiny random model repeat its input token
forever, which would let a broken verifier pass the lossless tests. Rescaled weights and an untied
LM head give varied continuations with clear argmax margins.
"""

from __future__ import annotations

from typing import Optional

import torch

from lilicorr.config import Config, load_config


def tiny_config(arch: str = "llama", vocab_size: int = 512, overrides: Optional[list[str]] = None) -> Config:
    return load_config("tiny-random", [f"target.arch={arch}", f"target.vocab_size={vocab_size}",
                                       "target.tie_word_embeddings=false", *(overrides or [])])


def varied_random_target(cfg: Config, seed: int = 1, logit_scale: float = 1.0):
    """build_random_target with weights ~ N(0, 1/fan_in), embeddings ~ N(0, 1); eval mode, fp32."""
    from lilicorr.models.target import build_random_target

    model = build_random_target(cfg.target)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
        model.model.embed_tokens.weight.copy_(torch.randn(model.model.embed_tokens.weight.shape, generator=g))
        model.get_output_embeddings().weight.mul_(logit_scale)
    return model.eval()
