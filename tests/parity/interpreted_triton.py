"""Every Triton kernel run on CPU by the Triton interpreter, in a child process: the cases and their inputs, for
tests/parity/test_parity_topk_features.py and test_parity_walk.py (the kernels against their references).

TRITON_INTERPRET=1 must be set before triton is first imported, and setting it in the pytest process would send
every other test's CPU kernel calls through the (slow) interpreter. So a child process (this file run as a script)
runs the kernels on inputs regenerated from each case's seed and saves the outputs; the tests rebuild the same
inputs and compare with the references. One child runs the cases of both kernels, once per pytest process
(`outputs`), whichever test asks first. The child also records whether importing lilicorr.kernels pulled in triton
(it must not).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
NO_TRITON = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


# ---------------------------------------------------------------- cases
@dataclass(frozen=True)
class TopKCase:
    n: int
    v: int
    k: int
    dtype: str
    pattern: str  # random | ties | negative | ascending
    splits: int | None = None  # programs per row (None: the default, 1 on CPU)
    block: int | None = None  # chunk width (None: the default, min(4096, V))
    slow: bool = False

    @property
    def name(self) -> str:
        return f"topk-n{self.n}-v{self.v}-k{self.k}-{self.dtype}-{self.pattern}-s{self.splits}-b{self.block}"


@dataclass(frozen=True)
class LatticeCase:
    c: int
    s: int
    k: int
    d: int
    dtype: str
    pattern: str  # random | ties | equal
    block_d: int | None = None  # d-chunk (None: all of d at once on CPU)
    slow: bool = False

    @property
    def name(self) -> str:
        return f"lattice-c{self.c}-s{self.s}-k{self.k}-d{self.d}-{self.dtype}-{self.pattern}-bd{self.block_d}"


TOPK_CASES = [
    TopKCase(4, 1000, 1, "fp32", "random"),
    TopKCase(4, 1000, 4, "bf16", "ties"),
    TopKCase(4, 1000, 16, "fp32", "negative", splits=3, block=128),  # multi-chunk, split rows
    TopKCase(2, 1000, 8, "fp32", "ascending", block=64),  # every chunk beats the running K-th
    TopKCase(3, 1000, 5, "fp32", "ascending", block=64),  # K < KP: unused slots never enter the output
    TopKCase(2, 1000, 3, "bf16", "ties", splits=2, block=128),
    TopKCase(2, 1000, 8, "bf16", "ties", splits=4, block=64),  # ties across split boundaries
    TopKCase(2, 49152, 8, "bf16", "random", block=4096),  # the GPU's chunk width
    TopKCase(2, 49152, 16, "fp32", "ties", splits=4),
    TopKCase(2, 151936, 8, "bf16", "negative", splits=3),
    TopKCase(15, 49152, 8, "bf16", "random", slow=True),  # Table 4 slot count
    TopKCase(4, 151936, 16, "fp32", "ties", splits=5, block=4096, slow=True),
    TopKCase(3, 151936, 4, "bf16", "random", splits=16, slow=True),
    TopKCase(4, 49152, 1, "fp32", "negative", slow=True),
]
# The interpreter's cost grows with C x S x (d-chunks): keep the big products few.
LATTICE_CASES = [
    LatticeCase(1, 3, 1, 64, "fp32", "random"),
    LatticeCase(2, 3, 4, 64, "bf16", "random", block_d=16),  # the GPU's chunked d loop
    LatticeCase(2, 15, 8, 64, "fp32", "ties"),
    LatticeCase(1, 3, 4, 100, "bf16", "equal", block_d=32),  # all scores equal; ragged last chunk
    LatticeCase(1, 15, 16, 1024, "bf16", "random"),
    LatticeCase(5, 3, 8, 1024, "fp32", "random"),
    LatticeCase(32, 3, 8, 64, "fp32", "random", slow=True),
    LatticeCase(5, 15, 8, 1024, "bf16", "random", slow=True),  # Table 4 sizes
    LatticeCase(5, 15, 16, 1024, "fp32", "ties", slow=True),
    LatticeCase(2, 15, 1, 64, "bf16", "random", slow=True),
]
RULES = ("greedy", "viterbi")


def _gen(name: str) -> torch.Generator:
    return torch.Generator().manual_seed(sum(map(ord, name)) * 7919 % (2**31))


def make_topk_input(case: TopKCase) -> torch.Tensor:
    g = _gen(case.name)
    n, v = case.n, case.v
    if case.pattern == "random":
        x = 3.0 * torch.randn(n, v, generator=g)
    elif case.pattern == "ties":  # few distinct values: the top-K is decided by ids
        x = torch.randint(-3, 2, (n, v), generator=g).float()
    elif case.pattern == "ascending":
        x = torch.arange(v, dtype=torch.float32).repeat(n, 1) / v
    elif case.pattern == "negative":
        x = torch.randn(n, v, generator=g)
        r = torch.rand(n, v, generator=g)
        x[r < 0.3] = -1e30
        x[r > 0.7] = float("-inf")
        x[0, : v // 2] = -1e30  # a row whose first half is effectively dead
        x[-1] = float("-inf")  # a row with fewer than K finite logits
        x[-1, [v // 3, v - 1]] = torch.tensor([1.5, -2.0])
        x[-1, [5, v // 2]] = -1e30
    else:
        raise ValueError(case.pattern)
    return x.to(DTYPES[case.dtype])


def make_lattice_input(case: LatticeCase) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = _gen(case.name)
    c, s, k, d = case.c, case.s, case.k, case.d
    out_vecs = torch.randn(c, s, k, d, generator=g)
    in_vecs = torch.randn(c, s, k, d, generator=g)
    anchor = torch.randn(c, d, generator=g)
    if case.pattern == "ties":  # duplicated candidates give exactly equal scores
        in_vecs[:, :, k // 2 :] = in_vecs[:, :, : k - k // 2].clone()
        out_vecs[:, :, 1::2] = out_vecs[:, :, 0::2][:, :, : k // 2].clone()
    elif case.pattern == "equal":
        out_vecs[:] = anchor[0]
        in_vecs[:] = 3.0 * anchor[0]
        anchor[:] = anchor[0]
    dt = DTYPES[case.dtype]
    return out_vecs.to(dt), in_vecs.to(dt), anchor.to(dt)


# ---------------------------------------------------------------- the child process
def run_cases(out_file: str, slow: bool) -> None:
    """In the child (TRITON_INTERPRET=1): run every kernel on every case, save the outputs."""
    import lilicorr.kernels.lattice  # noqa: F401
    import lilicorr.kernels.topk_logsoftmax  # noqa: F401

    heavy = [m for m in ("triton", "ray", "deepspeed", "mlflow") if m in sys.modules]
    from safetensors.torch import save_file

    from lilicorr.kernels.lattice import match_and_walk
    from lilicorr.kernels.lattice_triton import match_and_walk_triton
    from lilicorr.kernels.topk_logsoftmax import topk_logsoftmax
    from lilicorr.kernels.topk_logsoftmax_triton import topk_logsoftmax_triton

    out = {"heavy_imports": torch.tensor([len(heavy)])}
    for case in TOPK_CASES:
        if case.slow != slow:
            continue
        t = time.time()
        x = make_topk_input(case)
        ids, lps, feats = topk_logsoftmax_triton(x, case.k, num_splits=case.splits, block=case.block)
        out |= {f"{case.name}/ids": ids, f"{case.name}/logprobs": lps, f"{case.name}/features": feats}
        if case.splits is None and case.block is None:  # the public dispatch takes the same path
            out[f"{case.name}/dispatch_ids"] = topk_logsoftmax(x, case.k).ids
        out[f"{case.name}/seconds"] = torch.tensor([time.time() - t])
    for case in LATTICE_CASES:
        if case.slow != slow:
            continue
        t = time.time()
        o, i, a = make_lattice_input(case)
        for rule in RULES:
            path, anchor_sc, pair_sc = match_and_walk_triton(o, i, a, 8.0, rule, write_scores=True, block_d=case.block_d,
                                                             split=False)
            out |= {f"{case.name}/{rule}/path": path, f"{case.name}/anchor": anchor_sc, f"{case.name}/pair": pair_sc}
            # the split form: (sequence, slot) programs, then the walk
            path, anchor_sc, pair_sc = match_and_walk_triton(o, i, a, 8.0, rule, write_scores=True, block_d=case.block_d,
                                                             split=True)
            out |= {f"{case.name}/{rule}/split_path": path, f"{case.name}/{rule}/split_anchor": anchor_sc,
                    f"{case.name}/{rule}/split_pair": pair_sc}
        out[f"{case.name}/dispatch_path"] = match_and_walk(o, i, a, 8.0, "greedy")
        out[f"{case.name}/seconds"] = torch.tensor([time.time() - t])
    save_file({k: v.contiguous() for k, v in out.items()}, out_file)


_RUNS: dict[bool, object] = {}  # slow -> the child's outputs, or why it failed (a failed child is not rerun)


def outputs(slow: bool) -> dict[str, torch.Tensor]:
    """The child's outputs for the slow (or the default) cases: run once per pytest process."""
    if slow not in _RUNS:
        from safetensors.torch import load_file

        with tempfile.TemporaryDirectory() as tmp:
            out_file = str(Path(tmp) / "out.safetensors")
            env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
            cmd = [sys.executable, __file__, out_file, "slow" if slow else "default"]
            proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
            _RUNS[slow] = load_file(out_file) if proc.returncode == 0 else proc.stderr[-4000:]
    found = _RUNS[slow]
    assert isinstance(found, dict), found
    return found


def params(cases):
    """pytest params of `cases`, the slow ones marked slow."""
    return [pytest.param(c, id=c.name, marks=[pytest.mark.slow] if c.slow else []) for c in cases]


if __name__ == "__main__":
    run_cases(sys.argv[1], slow=sys.argv[2] == "slow")
