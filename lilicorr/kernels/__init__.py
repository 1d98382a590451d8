"""Kernels (Triton on CUDA; oneDNN, TorchScript or C on CPU), each beside its plain-torch reference. Never imports Ray, DeepSpeed or MLflow.

A kernel's module holds its reference (`*_reference`, the one its tests compare against) and the function the
engine calls; the Triton kernels live in `*_triton.py`, imported lazily by those functions (dispatch.py), so
importing this package or a reference module never imports triton. native/ holds C kernels built by the
machine's compiler on first use. What each module holds: README.md's Layout and docs/design.md §2.
"""
