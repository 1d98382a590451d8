"""Ray actors that run evaluation cells: each loads the target once and runs cells one after another.

On a cluster with GPUs each actor holds one GPU; on CPU it holds `threads` CPUs and sets torch to as
many threads, so actors sharing a machine do not oversubscribe it (the timings stay comparable).
Each actor call runs one setting's cells interleaved (evaluate/cells.py). Results come back to the
driver, which alone talks to MLflow.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Iterator, Optional

from lilicorr.platform.evaluate.plan import Cell


class EvalWorker:
    """The actor body (wrapped with ray.remote by `run_settings`)."""

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
        self._filled: dict[tuple, list[dict]] = {}  # rows with the target's own turns, by row ids

    def run_setting(self, cells: list[dict], rows: list[dict], checkpoints: dict[str, Optional[str]], timing: bool,
                    repeats: int = 1) -> list[dict]:
        """The cells of one setting, interleaved (evaluate/cells.py): one result per cell, in order."""
        from lilicorr.platform.benchmark_prompts import (fill_target_turns, needs_target_turns, rows_prompt_ids,
                                                         target_answerer)
        from lilicorr.platform.evaluate.cells import run_setting

        try:
            if needs_target_turns(rows):  # mt-bench-turn2: the target's own turn-1 answers, once per actor
                key = tuple(r["id"] for r in rows)
                if key not in self._filled:
                    self._filled[key] = fill_target_turns(rows, target_answerer(self.cfg, self.model, self.tokenizer,
                                                                                self.stop_ids))
                rows = self._filled[key]
            prompts = rows_prompt_ids(self.tokenizer, rows, self.cfg.target.enable_thinking)
            results = run_setting(self.cfg, self.model, [Cell(**c) for c in cells], prompts, checkpoints,
                                  self.stop_ids, timing, repeats)
        except Exception as e:  # noqa: BLE001 — a setting whose prompts or run fail is reported; the others still run
            import traceback

            traceback.print_exc()
            return [{"cell": c, "error": f"{type(e).__name__}: {e}"} for c in cells]
        for res in results:
            res["cell"] = asdict(res["cell"])
            if "outputs" in res:
                res["outputs"] = [{"id": r["id"], "category": r.get("category"), "output_ids": o,
                                   "text": self.tokenizer.decode(o, skip_special_tokens=True)}
                                  for r, o in zip(rows, res["outputs"])]
        return results


def run_settings(cfg: dict, jobs: list[tuple[list[Cell], list[dict], dict[str, Optional[str]]]],
                 workers: int, timing: bool, repeats: int = 1) -> Iterator[dict]:
    """Fan the settings (the cells of one setting, its prompts, each system's export) out over `workers`
    actors; yield each cell's result as its setting finishes."""
    import ray
    from ray.util import ActorPool

    from lilicorr.platform.train.driver import ensure_ray

    ensure_ray(log_to_driver=False)
    gpus = int(ray.cluster_resources().get("GPU", 0))
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
        for results in pool.map_unordered(lambda a, job: a.run_setting.remote(
                [asdict(c) for c in job[0]], job[1], job[2], timing, repeats), jobs):
            yield from results
    finally:
        for a in actors:
            ray.kill(a)
