"""One optimizer step of the DeepSpeed engine over `grad_accum` micro-batches (gradient accumulation).

DeepSpeed counts micro-steps itself (`gradient_accumulation_steps` in its config): `engine.backward` divides
each micro-batch's loss by grad_accum and all-reduces (ZeRO-0/1) or reduce-scatters (ZeRO-2) only at the
accumulation boundary; `engine.step` is called after every micro-batch and applies clipping + AdamW only at
the boundary. So grad_accum micro-batches of m rows give the update of one batch of grad_accum x m rows when
every row carries the same loss weight (the loss is a weighted mean over a batch's slots).

The gradient norm is read at the boundary: from the gradients themselves where every rank holds them whole
(ZeRO-0 fp32, between the boundary backward and step), else DeepSpeed's own pre-clipping figure, which its
optimizer computes inside that step (ZeRO >= 1 or bf16 move gradients out of `.grad`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

import torch


@dataclass
class StepOutput:
    """What the progress log reads from a step: the mean over its micro-batches (metrics: the last one's)."""

    loss: torch.Tensor  # scalar, detached
    terms: dict[str, torch.Tensor]
    metrics: dict[str, float] = field(default_factory=dict)


def _norm_from_grads(engine) -> Optional[float]:
    grads = [p.grad for p in engine.module.parameters() if p.requires_grad]
    if grads and all(g is not None for g in grads):
        return float(torch.linalg.vector_norm(torch.stack([g.detach().float().norm() for g in grads])))
    return None


def accumulate_step(engine, micro_batches: Iterable[tuple], forward: Callable[[int, tuple], object]
                    ) -> tuple[StepOutput, Optional[float]]:
    """Forward/backward every micro-batch of one optimizer step, stepping the engine after each.

    `forward(i, batch)` runs micro-batch i through the engine and returns its JointOutput. Returns the step's
    mean output and the pre-clipping global gradient norm. Raises if the micro-batches did not end exactly at
    DeepSpeed's accumulation boundary (ranks would disagree on which micro-batch steps the optimizer).
    """
    losses, terms, metrics, norm, boundary = [], {}, {}, None, False
    for i, batch in enumerate(micro_batches):
        if boundary:
            raise RuntimeError("more micro-batches than train.micro_batch x grad_accum in one optimizer step")
        out = forward(i, batch)
        engine.backward(out.loss)
        boundary = engine.is_gradient_accumulation_boundary()
        if boundary:
            norm = _norm_from_grads(engine)
        engine.step()  # a no-op for the optimizer before the boundary
        if boundary and norm is None:
            value = engine.get_global_grad_norm()
            norm = None if value is None else float(value)
        losses.append(out.loss.detach().float())
        for k, v in out.terms.items():
            terms.setdefault(k, []).append(v.detach().float())
        metrics = dict(out.metrics) or metrics
    if not boundary:
        raise RuntimeError(f"{len(losses)} micro-batches stopped before DeepSpeed's accumulation boundary")
    mean = StepOutput(loss=torch.stack(losses).mean(), terms={k: torch.stack(v).mean() for k, v in terms.items()},
                      metrics=metrics)
    return mean, norm
