"""The Ray Serve deployment: one replica = one target, one engine thread per served system, FastAPI ingress.

No `@serve.batch`: it would run whole calls in lockstep; each engine thread's step loop batches
requests continuously (admitting new ones between blocks). `check_health` raises when a step loop has
died or stalled, so Serve replaces the replica.

    serve run infra/serve-config.yaml                       # the `serve run` config (builder below)
    python jobs/serve.py --preset smollm2-135m              # the same through serve.run, on 127.0.0.1
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from ray import serve

from .loading import ServeSpec, load_state, stop_all


@serve.deployment(  # named after the class: LiLiCorrOpenAI
    num_replicas=1,
    max_ongoing_requests=512,  # the engine's bounded queue refuses with 429 long before this
    health_check_period_s=10,
    health_check_timeout_s=30,
    ray_actor_options={"num_cpus": 0},
)
@serve.ingress()
class LiLiCorrOpenAI:
    def __init__(self, spec: dict):
        from .metrics import RayServeMetrics

        self.state = load_state(ServeSpec(**spec), metrics=RayServeMetrics())

    def __serve_build_asgi_app__(self):
        from .app import build_app

        return build_app(self.state)

    def check_health(self) -> None:
        problems = self.state.unhealthy()
        if problems:
            raise RuntimeError("; ".join(problems))

    def __del__(self):
        state = getattr(self, "state", None)
        if state is not None:
            stop_all(state.models)


def application(spec: ServeSpec, num_replicas: int = 1, num_cpus: float = 0, num_gpus: float = 0,
                autoscaling_config: Optional[dict] = None):
    """A bound Serve application for `spec` (what `serve.run` takes).

    The replica's GPU reservation travels in the spec (`num_gpus`): the loader puts the models on cuda
    exactly when the replica holds a GPU. With `autoscaling_config` (Serve's: min_replicas, max_replicas,
    target_ongoing_requests, ...) Serve sizes the replica count and `num_replicas` is not given.
    """
    opts: dict[str, Any] = {"num_cpus": num_cpus}
    if num_gpus:
        opts["num_gpus"] = num_gpus
    spec = dataclasses.replace(spec, num_gpus=num_gpus)
    count: dict[str, Any] = ({"autoscaling_config": dict(autoscaling_config)} if autoscaling_config
                             else {"num_replicas": num_replicas})
    return LiLiCorrOpenAI.options(ray_actor_options=opts, **count).bind(dataclasses.asdict(spec))


SIZING = ("num_replicas", "num_cpus", "num_gpus", "autoscaling_config")


def app_builder(args: dict):
    """`serve run` / RayService builder: `args` are ServeSpec fields (systems / checkpoints as lists or
    comma-separated strings), plus optional num_replicas or autoscaling_config, num_cpus, num_gpus."""
    args = dict(args)
    sizing = {k: args.pop(k) for k in SIZING if k in args}
    if "num_replicas" in sizing and sizing.get("autoscaling_config"):
        raise ValueError("serve args: give num_replicas or autoscaling_config, not both (Serve refuses both)")
    for key in ("systems", "checkpoints", "overrides"):
        if isinstance(args.get(key), str):
            args[key] = [s.strip() for s in args[key].split(",") if s.strip()]
    known = {f.name for f in dataclasses.fields(ServeSpec)}
    unknown = sorted(set(args) - known)
    if unknown:
        raise ValueError(f"unknown serve args {unknown}; known: {sorted(known - {'num_gpus'} | set(SIZING))}")
    return application(ServeSpec(**args), int(sizing.get("num_replicas", 1)), float(sizing.get("num_cpus", 0)),
                       float(sizing.get("num_gpus", 0)), sizing.get("autoscaling_config"))
