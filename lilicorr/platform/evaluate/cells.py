"""One evaluation setting in one process: its systems decode a benchmark's prompts, interleaved.

A setting is (benchmark, temperature, seed, concurrency); its cells are the systems evaluated at it. Each
system is built once and warmed up; then the prompts go through every system in turn, one *unit* at a time —
one prompt at concurrency 1, the whole prompt set (continuous batching over `concurrency` rows) above — the
system order rotating from unit to unit, and the whole pass repeats `repeats` times. A machine whose speed
drifts (a shared 2-core box, a throttling laptop) then slows every system alike, and each (unit, round) is a
paired measurement of every system against AR.

Per cell: τ, outputs, per-slot acceptance and stage timers from the first round (a repeat decodes the same
tokens); tokens/s pooled over every round; the speedup over AR at the same setting as the ratio of pooled
tokens/s with a 95% paired bootstrap interval over the (unit, round) measurements; τ with a 95% bootstrap
interval over prompts. Engine systems run through `build_decoder`; the external peers run transformers
`generate` on the same target, prompts and token budget (`hf`: plain greedy / sampling, batched with left
padding at concurrency > 1; `hf-pld`: prompt-lookup decoding, batch 1).
"""

from __future__ import annotations

import copy
import time
from typing import Optional

import numpy as np
import torch

from lilicorr.platform.evaluate.plan import PEERS, Cell
from lilicorr.platform.intervals import interval, pooled_tau, speed_ratio

PLD_TOKENS = 10  # prompt_lookup_num_tokens (transformers' documented default for the feature)


class EngineSystem:
    """A cell's engine decoder, built and warmed up once; `decode` runs one unit of prompts."""

    def __init__(self, cfg, model, cell: Cell, prompts: list[list[int]], checkpoint: Optional[str], stop_ids,
                 timing: bool):
        from lilicorr.engine.requests import Request
        from lilicorr.engine.systems import build_decoder
        from lilicorr.platform.evaluate.variants import engine_system

        cfg = copy.deepcopy(cfg)
        e = cfg.engine
        e.temperature, e.seed, e.max_batch_size = cell.temperature, cell.seed, cell.concurrency
        e.max_seq_len = max(e.max_seq_len, max(len(p) for p in prompts) + e.max_new_tokens + 8)
        self.cell, self.prompts, self.timing = cell, prompts, timing
        self.dec = build_decoder(cfg, model, engine_system(cell.system), checkpoint=checkpoint, stop_ids=stop_ids,
                                 timing=timing, max_batch=cell.concurrency)
        # which implementation ran each computation (engine/backend.py): the cell's MLflow params backend.*
        self.backend = self.dec.backend_plan.record()
        self.dec.generate([Request("warmup", prompts[0], max_new_tokens=4, seed=cell.seed)])
        self.dec.stats.__init__(block_size=self.dec.stats.block_size)  # measure the cell only
        self.dec.timers.__init__(timing, model.device)
        self.first_round: Optional[dict] = None

    def decode(self, idx: list[int]) -> tuple[list[list[int]], float, np.ndarray]:
        """Outputs, wall seconds and per prompt (accepted draft tokens, blocks) of prompts `idx`."""
        from lilicorr.engine.requests import Request

        reqs = [Request(i, self.prompts[i], seed=self.cell.seed * 100_003 + i) for i in idx]
        t0 = time.perf_counter()
        results = self.dec.generate(reqs)
        wall = time.perf_counter() - t0
        bad = next((r for r in results if r.error is not None), None)
        if bad is not None:
            raise RuntimeError(f"request {bad.request_id}: {bad.error}")
        acc = np.array([[r.accepted_tokens, r.blocks] for r in results], dtype=np.float64)
        return [list(r.output_ids) for r in results], wall, acc

    def end_round(self) -> None:
        """After the first round: its counters are the cell's τ, slot acceptance and stage timers."""
        if self.first_round is not None:
            return
        s = self.dec.stats
        out = {"tau": s.tau, "blocks": s.blocks, "accepted_draft_tokens": s.accepted_draft,
               **{f"slot_acceptance.{i}": a / n for i, (a, n) in enumerate(zip(s.slot_accepted, s.slot_proposed), 1)
                  if n}}
        if self.timing:
            out.update({f"stage_ms.{k.removesuffix('_ms')}": v for k, v in self.dec.timers.summary(s.blocks).items()})
        self.first_round = out


class PeerSystem:
    """transformers `generate` on the same target (`hf`, `hf-pld`); `decode` runs one unit of prompts."""

    def __init__(self, cfg, model, cell: Cell, prompts: list[list[int]], stop_ids):
        self.cfg, self.model, self.cell, self.prompts, self.stop_ids = cfg, model, cell, prompts, stop_ids
        self.first_round: Optional[dict] = {}
        hf_generate(model, prompts[:1], 4, stop_ids)  # warm-up, as the engine's

    def decode(self, idx: list[int]) -> tuple[list[list[int]], float, None]:
        c = self.cell
        outs, wall = hf_generate(self.model, [self.prompts[i] for i in idx], self.cfg.engine.max_new_tokens,
                                 self.stop_ids, c.temperature, c.seed, batch=c.concurrency, first=idx[0],
                                 prompt_lookup=PLD_TOKENS if c.system == "hf-pld" else None)
        return outs, wall, None

    def end_round(self) -> None:
        pass


def left_pad(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), both (rows, longest prompt), padded on the left with 0: every row's prompt ends at
    the same column, where transformers `generate` appends."""
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):] = torch.tensor(p)
        mask[r, width - len(p):] = 1
    return ids, mask


def hf_generate(model, prompts: list[list[int]], max_new: int, stop_ids, temperature: float = 0.0,
                seed: int = 0, batch: int = 1, prompt_lookup: Optional[int] = None,
                first: int = 0) -> tuple[list[list[int]], float]:
    """transformers `generate` over the prompts, `batch` at a time (left padded): outputs and wall seconds.

    Sampling is untruncated (top_k 0, top_p 1), as the engine's T = 1; greedy passes no sampling knobs. A chunk
    is seeded by its first prompt's index in the benchmark (`first` + offset), so a prompt samples alike
    whether it is decoded alone or with the others.
    """
    dev = next(model.parameters()).device
    kw = dict(max_new_tokens=max_new, eos_token_id=list(stop_ids) or None, pad_token_id=0)
    if temperature > 0:
        kw.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    else:
        kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    if prompt_lookup:
        kw["prompt_lookup_num_tokens"] = prompt_lookup
    outs: list[list[int]] = []
    wall = 0.0
    stops = set(stop_ids)
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        ids, mask = left_pad(chunk)
        width = ids.shape[1]
        torch.manual_seed(seed * 100_003 + first + i)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids.to(dev), attention_mask=mask.to(dev), **kw)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        wall += time.perf_counter() - t0
        for r in range(len(chunk)):
            new = out[r, width:].tolist()
            cut = next((j + 1 for j, t in enumerate(new) if t in stops), len(new))  # drop padding after a stop
            outs.append(new[:cut])
    return outs, wall


def units(n: int, concurrency: int) -> list[list[int]]:
    """The timed units of n prompts: each prompt alone at concurrency 1, else all of them in one call."""
    return [[i] for i in range(n)] if concurrency == 1 else [list(range(n))]


def run_setting(cfg, model, cells: list[Cell], prompts: list[list[int]], checkpoints: dict[str, Optional[str]],
                stop_ids, timing: bool = False, repeats: int = 1, seed: int = 0) -> list[dict]:
    """Every cell of one setting, interleaved (module docstring): [{"cell", "metrics", "outputs"} (engine cells
    also "backend": its BackendPlan.record()) or {"cell", "error"}] in the order of `cells`. A system that fails to
    build or decode is reported with its error; the others go on."""
    assert len({c.setting for c in cells}) == 1, "run_setting takes the cells of one setting"
    systems: dict[Cell, EngineSystem | PeerSystem] = {}
    errors: dict[Cell, str] = {}

    def fail(cell: Cell, e: Exception) -> None:
        import traceback

        traceback.print_exc()
        errors[cell] = f"{type(e).__name__}: {e}"
        systems.pop(cell, None)

    for cell in cells:
        try:
            systems[cell] = (PeerSystem(cfg, model, cell, prompts, stop_ids) if cell.system in PEERS else
                             EngineSystem(cfg, model, cell, prompts, checkpoints.get(cell.system), stop_ids, timing))
        except Exception as e:  # noqa: BLE001 — one failing system is reported; the others still run
            fail(cell, e)
    plan = units(len(prompts), cells[0].concurrency)
    outputs: dict[Cell, list] = {c: [None] * len(prompts) for c in cells}
    accepted: dict[Cell, list] = {c: [None] * len(prompts) for c in cells}
    timed: dict[Cell, list[tuple[int, float]]] = {c: [] for c in cells}  # per (unit, round): (tokens, seconds)
    turn = 0
    for rnd in range(max(1, repeats)):
        for idx in plan:
            order = list(systems)
            order = order[turn % len(order):] + order[:turn % len(order)] if order else order
            turn += 1
            for cell in order:
                try:
                    outs, wall, acc = systems[cell].decode(idx)
                except Exception as e:  # noqa: BLE001
                    fail(cell, e)
                    continue
                timed[cell].append((sum(map(len, outs)), wall))
                if rnd == 0:
                    for j, i in enumerate(idx):
                        outputs[cell][i] = outs[j]
                        if acc is not None:
                            accepted[cell][i] = acc[j]
        for s in systems.values():
            s.end_round()
    rng = np.random.default_rng(seed)
    ar = next((c for c in systems if c.system == "ar"), None)
    results = []
    for cell in cells:
        if cell in errors:
            results.append({"cell": cell, "error": errors[cell]})
            continue
        t = np.array(timed[cell], dtype=np.float64)  # (units x rounds, 2) tokens, seconds
        m = {"tokens_per_s": t[:, 0].sum() / t[:, 1].sum(), "generated_tokens": int(sum(map(len, outputs[cell]))),
             "wall_s": float(t[:, 1].sum()), "rounds": max(1, repeats), "prompts": len(prompts), "errors": 0,
             **systems[cell].first_round}
        if cell.system not in PEERS:
            acc = np.stack(accepted[cell])  # (prompts, 2)
            m["tau_lo"], m["tau_hi"] = interval(acc, pooled_tau, rng)
        if ar is not None:
            pair = np.concatenate([t, np.array(timed[ar], dtype=np.float64)], 1)  # same (unit, round) order
            m["speedup"] = speed_ratio(pair)
            if cell != ar:
                m["speedup_lo"], m["speedup_hi"] = interval(pair, speed_ratio, rng)
        res = {"cell": cell, "metrics": m, "outputs": outputs[cell]}
        if isinstance(systems[cell], EngineSystem):
            res["backend"] = systems[cell].backend
        results.append(res)
    return results
