"""Nested training state (optimizer state dicts, counters) as safetensors + JSON, never pickle.

`save_tree(tree, stem)` writes `stem.safetensors` (every tensor leaf) and `stem.json` (the structure,
with tensors replaced by references). Dict keys keep their type (AdamW keys its state by int), tuples stay
tuples. Anything else (an arbitrary object) is refused by path, so an unexpected optimizer state fails
loudly at save time instead of resuming wrong.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

_SCALARS = (int, float, str, bool, type(None))


def _encode(obj: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj.detach().contiguous().cpu()
        return {"__tensor__": key}
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if not isinstance(k, (int, str)):
                raise TypeError(f"state key {k!r} at {path} is neither int nor str")
            items.append([k, _encode(v, f"{path}/{k}", tensors)])
        return {"__dict__": items}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, f"{path}[{i}]", tensors) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, f"{path}[{i}]", tensors) for i, v in enumerate(obj)]
    if isinstance(obj, float) and not math.isfinite(obj):  # JSON has no nan / inf: "nan", "inf" or "-inf"
        return {"__float__": str(obj)}
    if isinstance(obj, _SCALARS):
        return obj
    raise TypeError(f"cannot store {type(obj).__name__} at {path} without pickle")


def _decode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__dict__" in obj:
            return {k: _decode(v, tensors) for k, v in obj["__dict__"]}
        if "__tuple__" in obj:
            return tuple(_decode(v, tensors) for v in obj["__tuple__"])
        if "__float__" in obj:
            return float(obj["__float__"])
        raise ValueError(f"unknown encoded node {sorted(obj)}")
    return obj


def save_tree(tree: Any, stem: str | Path) -> None:
    from safetensors.torch import save_file

    stem = Path(stem)
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _encode(tree, "", tensors)
    # safetensors refuses tensors that share storage; clone views so each leaf stands alone.
    save_file({k: v.clone() for k, v in tensors.items()}, str(stem.with_suffix(".safetensors")))
    stem.with_suffix(".json").write_text(json.dumps(skeleton))


def load_tree(stem: str | Path, device: str | torch.device = "cpu") -> Any:
    from safetensors.torch import load_file

    stem = Path(stem)
    tensors = load_file(str(stem.with_suffix(".safetensors")), device=str(device))
    return _decode(json.loads(stem.with_suffix(".json").read_text()), tensors)
