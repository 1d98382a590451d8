"""Ways to start a drafter: random, copied from the target's top layers, or a public DFlash checkpoint.

The public z-lab DFlash release (e.g. z-lab/Qwen3-8B-DFlash-b16) stores, in safetensors:
    fc.weight (H, n*H), hidden_norm.weight, norm.weight,
    layers.{i}.input_layernorm.weight, layers.{i}.post_attention_layernorm.weight,
    layers.{i}.self_attn.{q,k,v,o}_proj.weight, layers.{i}.self_attn.{q,k}_norm.weight,
    layers.{i}.mlp.{gate,up,down}_proj.weight
and a config.json with `block_size`, `num_hidden_layers`, `num_target_layers` and a `dflash_config`
holding `target_layer_ids` (and, in newer releases, `mask_token_id`). Our module names are the same, so
the state dict loads by name; a `model.` prefix, if present, is stripped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from lilicorr.config import DrafterConfig
from lilicorr.models.drafter import DFlashDrafter


def build_drafter(cfg: DrafterConfig, target) -> DFlashDrafter:
    """The drafter for `target` (a TargetAdapter), initialised as `cfg.init` / `cfg.checkpoint` say."""
    drafter = DFlashDrafter(cfg, target)
    if cfg.init == "target_top":
        copy_target_top_layers(drafter, target.hf)
    elif cfg.init != "random":
        raise ValueError(f"unknown drafter.init {cfg.init!r} (expected 'random' or 'target_top')")
    if cfg.checkpoint:
        load_dflash_checkpoint(drafter, cfg.checkpoint)
    return drafter


def copy_target_top_layers(drafter: DFlashDrafter, hf_model) -> int:
    """Copy the target's top `num_layers` decoder layers into the drafter where names and shapes match.

    A Llama target has no q_norm/k_norm; those stay at ones. Returns how many tensors were copied.
    """
    target_layers = hf_model.model.layers
    n = len(drafter.layers)
    copied = 0
    for i, layer in enumerate(drafter.layers):
        src = target_layers[len(target_layers) - n + i].state_dict()
        own = layer.state_dict()
        update = {k: v for k, v in src.items() if k in own and own[k].shape == v.shape}
        layer.load_state_dict(update, strict=False)
        copied += len(update)
    return copied


def read_dflash_config(folder: str | os.PathLike) -> dict:
    path = Path(folder) / "config.json"
    return json.loads(path.read_text()) if path.exists() else {}


def load_dflash_checkpoint(drafter: DFlashDrafter, folder: str | os.PathLike) -> None:
    """Load a public DFlash checkpoint folder (config.json + *.safetensors) into `drafter`, strictly."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"DFlash checkpoint {str(folder)!r} is not a local folder; download it first (the platform's "
            "asset step resolves hub ids to folders)")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {folder}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        for k, v in load_file(str(f)).items():
            state[k.removeprefix("model.")] = v
    own = drafter.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(f"DFlash checkpoint {folder} does not match the drafter: missing {missing[:6]}, "
                         f"unexpected {unexpected[:6]}")
    bad = [k for k in own if own[k].shape != state[k].shape]
    if bad:
        raise ValueError(f"shape mismatch for {bad[:6]}: checkpoint {state[bad[0]].shape} vs drafter {own[bad[0]].shape}")
    drafter.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})
    meta = read_dflash_config(folder)
    ids = (meta.get("dflash_config") or {}).get("target_layer_ids")
    if ids is not None and list(ids) != drafter.capture_ids:
        raise ValueError(f"checkpoint captures target layers {ids}, the adapter captures {drafter.capture_ids}")
    block = meta.get("block_size")
    if block is not None and block != drafter.block_size:
        raise ValueError(f"checkpoint block size {block} != drafter.block_size {drafter.block_size}")
    mask_id = (meta.get("dflash_config") or {}).get("mask_token_id")
    if mask_id is not None:
        drafter.mask_token_id = int(mask_id)
