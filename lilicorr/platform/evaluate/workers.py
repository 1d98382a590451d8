"""Ray actors that run evaluation cells: each loads the target once and runs cells one after another.

On a cluster with GPUs each actor holds one GPU; on CPU it holds `threads` CPUs and sets torch to as
many threads, so actors sharing a machine do not oversubscribe it (the timings stay comparable).
Results come back to the driver, which alone talks to MLflow.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Iterator, Optional

from lilicorr.platform.evaluate.plan import Cell


class EvalWorker:
    """The actor body (wrapped with ray.remote by `start_workers`)."""

    def __init__(self, cfg: dict, threads: int, use_gpu: bool):
        import torch

        from lilicorr.config import Config
        from lilicorr.platform.assets import eos_token_ids, load_target

        torch.set_num_threads(max(1, threads))
        self.cfg = Config.from_dict(cfg)
        self.model, self.tokenizer = load_target(self.cfg.target)
        if use_gpu and torch.cuda.is_available():
            self.model.to("cuda")
        self.stop_ids = eos_token_ids(self.cfg.target, self.tokenizer)

    def run(self, cell: dict, rows: list[dict], checkpoint: Optional[str], timing: bool) -> dict:
        from lilicorr.platform.chat import prompt_ids
        from lilicorr.platform.evaluate.cells import run_cell

        prompts = [prompt_ids(self.tokenizer, r["messages"], self.cfg.target.enable_thinking) for r in rows]
        try:
            res = run_cell(self.cfg, self.model, Cell(**cell), prompts, checkpoint, self.stop_ids, timing)
        except Exception as e:  # noqa: BLE001 — one failing cell is reported; the others still run
            import traceback

            traceback.print_exc()
            return {"cell": cell, "error": f"{type(e).__name__}: {e}"}
        texts = [self.tokenizer.decode(o, skip_special_tokens=True) for o in res["outputs"]]
        outputs = [{"id": r["id"], "category": r.get("category"), "output_ids": o, "text": t}
                   for r, o, t in zip(rows, res["outputs"], texts)]
        return {"cell": cell, "metrics": res["metrics"], "outputs": outputs}


def ensure_ray() -> None:
    import ray

    if not ray.is_initialized():
        # Inside `ray job submit` RAY_ADDRESS names the cluster; otherwise start a local one.
        ray.init(**({} if os.environ.get("RAY_ADDRESS") else {"address": "local", "include_dashboard": False}),
                 log_to_driver=False)


def cluster_gpus() -> int:
    import ray

    return int(ray.cluster_resources().get("GPU", 0))


def run_cells(cfg: dict, jobs: list[tuple[Cell, list[dict], Optional[str]]],
              workers: int, timing: bool) -> Iterator[dict]:
    """Fan the cells out over `workers` actors; yield each result as it finishes."""
    import ray
    from ray.util import ActorPool

    ensure_ray()
    gpus = cluster_gpus()
    use_gpu = gpus > 0
    if use_gpu:
        workers = min(workers or gpus, gpus)
        actor_cls = ray.remote(num_gpus=1)(EvalWorker)
        threads = 4
    else:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        workers = max(1, min(workers or 1, cpus))
        threads = max(1, cpus // workers)
        actor_cls = ray.remote(num_cpus=threads)(EvalWorker)
    actors = [actor_cls.remote(cfg, threads, use_gpu) for _ in range(min(workers, len(jobs)) or 1)]
    pool = ActorPool(actors)
    try:
        yield from pool.map_unordered(lambda a, job: a.run.remote(asdict(job[0]), job[1], job[2], timing), jobs)
    finally:
        for a in actors:
            ray.kill(a)
