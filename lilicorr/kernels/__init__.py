"""Triton kernels, each beside its plain-torch reference. Never imports Ray, DeepSpeed or MLflow."""
