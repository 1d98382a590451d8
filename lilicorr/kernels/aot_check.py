"""Compile a Triton kernel for an NVIDIA target on a machine without a GPU (tests, diagnostics).

The CPU interpreter checks what a kernel computes but not that it compiles for a GPU: some
constructs run under the interpreter and fail in the compiler. Triton ships its own ptxas, so we can
lower a kernel all the way to a cubin here and read its resource usage with the bundled cuobjdump.
`aligned` names the arguments the JIT would mark as divisible by 16 (pointers from torch, strides of
contiguous tensors); without them loads are not vectorized or pipelined.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass


@dataclass
class CompiledInfo:
    ptx: str
    registers: int  # per thread; -1 when cuobjdump is unavailable
    local_bytes: int  # spill / stack memory per thread (0 = no spills)

    def instructions(self, pattern: str) -> set[str]:
        """Distinct PTX opcodes matching a regex prefix, e.g. r"mma\\.sync" or r"cp\\.async"."""
        return set(re.findall(rf"({pattern}\S*)", self.ptx))


def compile_for_cuda(
    kernel,
    signature: dict[str, str],
    constexprs: dict[str, object],
    aligned: list[str],
    arch: int = 90,
    num_warps: int = 4,
    num_stages: int = 3,
) -> CompiledInfo:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(kernel.arg_names)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    full_sig = {**signature, **{n: "constexpr" for n in constexprs}}
    src = ASTSource(fn=kernel, signature=full_sig, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(
        src, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps, "num_stages": num_stages}
    )
    return CompiledInfo(compiled.asm["ptx"], *_resource_usage(compiled.asm["cubin"]))


def _resource_usage(cubin: bytes) -> tuple[int, int]:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return -1, -1
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+) STACK:\d+ SHARED:\d+ LOCAL:(\d+)", text)
    if not m:
        return -1, -1
    return int(m.group(1)), int(m.group(2))
