"""One evaluation cell in one process: a system decodes a benchmark's prompts under one setting.

Engine systems run through `build_decoder` with `concurrency` rows decoded together (continuous
batching over all the cell's prompts) after a short warm-up request; the external peers run
transformers `generate` on the same target, prompts and token budget (`hf`: plain greedy / sampling,
batched with left padding at concurrency > 1; `hf-pld`: prompt-lookup decoding, batch 1).
The result is a flat dict of metrics plus the outputs.
"""

from __future__ import annotations

import copy
import time
from typing import Optional

import torch

from lilicorr.platform.evaluate.plan import PEERS, Cell

PLD_TOKENS = 10  # prompt_lookup_num_tokens (transformers' documented default for the feature)


def _engine_cell(cfg, model, cell: Cell, prompts: list[list[int]], checkpoint: Optional[str], stop_ids,
                 timing: bool) -> dict:
    from lilicorr.engine.requests import Request
    from lilicorr.engine.systems import build_decoder

    cfg = copy.deepcopy(cfg)
    e = cfg.engine
    e.temperature, e.seed, e.max_batch_size = cell.temperature, cell.seed, cell.concurrency
    e.max_seq_len = max(e.max_seq_len, max(len(p) for p in prompts) + e.max_new_tokens + 8)
    from lilicorr.platform.evaluate.variants import engine_system

    dec = build_decoder(cfg, model, engine_system(cell.system), checkpoint=checkpoint, stop_ids=stop_ids,
                        timing=timing, max_batch=cell.concurrency)
    dec.generate([Request("warmup", prompts[0], max_new_tokens=4, seed=cell.seed)])
    dec.stats.__init__(block_size=dec.stats.block_size)  # measure the cell only
    dec.timers.__init__(timing, model.device)
    reqs = [Request(i, p, seed=cell.seed * 100_003 + i) for i, p in enumerate(prompts)]
    results = dec.generate(reqs)
    s = dec.stats
    out = {"tau": s.tau, "tokens_per_s": s.tokens_per_s, "generated_tokens": s.generated, "blocks": s.blocks,
           "accepted_draft_tokens": s.accepted_draft, "wall_s": s.wall_s,
           "errors": sum(r.error is not None for r in results)}
    for i, (a, n) in enumerate(zip(s.slot_accepted, s.slot_proposed), 1):
        if n:
            out[f"slot_acceptance.{i}"] = a / n
    if timing:
        for k, v in dec.timers.summary(s.blocks).items():
            out[f"stage_ms.{k.removesuffix('_ms')}"] = v
    return {"metrics": out, "outputs": [r.output_ids for r in results]}


def hf_generate(model, prompts: list[list[int]], max_new: int, stop_ids, temperature: float = 0.0,
                seed: int = 0, batch: int = 1, prompt_lookup: Optional[int] = None) -> dict:
    """transformers `generate` over the prompts, `batch` at a time (left padded); tokens/s and outputs.

    Sampling is untruncated (top_k 0, top_p 1), as the engine's T = 1; greedy passes no sampling knobs.
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
    tokens, wall = 0, 0.0
    stops = set(stop_ids)
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        width = max(len(p) for p in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, p in enumerate(chunk):  # left padding: every row's prompt ends at the same column
            ids[r, width - len(p):] = torch.tensor(p)
            mask[r, width - len(p):] = 1
        torch.manual_seed(seed * 100_003 + i)
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
            tokens += cut
    return {"metrics": {"tokens_per_s": tokens / wall if wall else 0.0, "generated_tokens": tokens,
                        "wall_s": wall, "errors": 0}, "outputs": outs}


def run_cell(cfg, model, cell: Cell, prompts: list[list[int]], checkpoint: Optional[str], stop_ids,
             timing: bool = False) -> dict:
    """{"metrics": {...}, "outputs": [[ids]...]} for one cell (the model already loaded)."""
    if cell.system in PEERS:
        hf_generate(model, prompts[:1], 4, stop_ids)  # warm-up, as the engine's
        return hf_generate(model, prompts, cfg.engine.max_new_tokens, stop_ids, cell.temperature, cell.seed,
                           batch=cell.concurrency, prompt_lookup=PLD_TOKENS if cell.system == "hf-pld" else None)
    return _engine_cell(cfg, model, cell, prompts, checkpoint, stop_ids, timing)
