"""A Hugging Face config's RoPE settings: read them (either transformers generation) and extend them with YaRN.

Config-level, no tensors: the target's builder (models/target.py), the platform's loader (platform/assets.py) and
the engine's RoPE tables (engine/rope.py) read the same settings through here, so models never import the engine.
"""

from __future__ import annotations

from typing import Optional


def rope_scaling_of(config) -> tuple[float, Optional[dict]]:
    """(theta, scaling dict or None) from an HF config of either transformers generation."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and ("rope_type" in params or "rope_theta" in params):  # transformers 5.x
        theta = params.get("rope_theta", getattr(config, "rope_theta", None))
        return float(theta if theta is not None else 10000.0), params
    theta = getattr(config, "rope_theta", None)  # transformers 4.x
    return float(theta if theta is not None else 10000.0), getattr(config, "rope_scaling", None)


def extend_with_yarn(config, factor: float) -> None:
    """Set YaRN on an HF model config in place (before the model is built from it), as the paper serves inputs past
    the trained context: rope_type "yarn", `factor`, original_max_position_embeddings = the config's
    max_position_embeddings, which becomes factor x that. Only an unscaled ("default") RoPE can be extended."""
    theta, scaling = rope_scaling_of(config)
    kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"
    if kind != "default":
        raise ValueError(f"target.yarn_factor extends an unscaled RoPE, and this target's already has rope_type "
                         f"{kind!r}: drop target.yarn_factor (or give a checkpoint without rope scaling)")
    if not factor > 1:
        raise ValueError(f"target.yarn_factor={factor} must be > 1")
    original = int(config.max_position_embeddings)
    params = {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": original}
    if isinstance(getattr(config, "rope_parameters", None), dict) or not hasattr(config, "rope_scaling"):
        config.rope_parameters = {**(getattr(config, "rope_parameters", None) or {}), "rope_theta": theta, **params}
    else:  # transformers 4.x
        config.rope_scaling = params
    config.max_position_embeddings = int(round(original * factor))
