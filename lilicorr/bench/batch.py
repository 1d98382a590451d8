"""Batched greedy decoding (the regeneration path), ours against transformers' batched `generate`.

  engine_batch_tps(cfg, model, prompts, max_new, stop_ids, batch)   our AR decoder, `batch` rows at once
  hf_batch_tps(model, prompts, max_new, stop_ids, batch, pad_id)    transformers, left-padded batches
Both return (tokens/s wall, tokens per process-CPU-second, outputs cut after the first stop id). The CPU
figure is the one to read on a shared machine: wall time there mostly measures the other tenants.
"""

from __future__ import annotations

import time

import torch

from lilicorr.bench.harness import cut_at_stop, size_engine, warm_up
from lilicorr.engine.requests import Request
from lilicorr.engine.systems import build_decoder


def _timed(fn):
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    sync()
    return out, time.perf_counter() - w, time.process_time() - c


def engine_batch_tps(cfg, model, prompts, max_new: int, stop_ids, batch: int) -> tuple[float, float, list[list[int]]]:
    size_engine(cfg, prompts, max_new, slack=8)
    cfg.engine.temperature = 0.0
    dec = build_decoder(cfg, model, "ar", stop_ids=stop_ids, max_batch=batch)
    warm_up(dec, prompts[0])
    res, wall, cpu = _timed(lambda: dec.generate([Request(i, p, max_new_tokens=max_new)
                                                  for i, p in enumerate(prompts)]))
    outs = [cut_at_stop(list(r.output_ids), set(stop_ids)) for r in res]
    n = sum(len(o) for o in outs)
    return n / wall, n / max(cpu, 1e-9), outs


def hf_batch_tps(model, prompts, max_new: int, stop_ids, batch: int, pad_id: int = 0) -> tuple[float, float, list[list[int]]]:
    dev = next(model.parameters()).device
    stops = set(stop_ids)

    def run():
        outs = []
        for a in range(0, len(prompts), batch):
            group = prompts[a:a + batch]
            width = max(len(p) for p in group)
            ids = torch.full((len(group), width), pad_id, dtype=torch.long)
            att = torch.zeros_like(ids)
            for i, p in enumerate(group):  # left padding, as batched generation needs
                ids[i, width - len(p):] = torch.tensor(p)
                att[i, width - len(p):] = 1
            with torch.inference_mode():
                out = model.generate(ids.to(dev), attention_mask=att.to(dev), max_new_tokens=max_new,
                                     do_sample=False, eos_token_id=list(stop_ids) or None, pad_token_id=pad_id,
                                     temperature=None, top_p=None, top_k=None)
            outs += [cut_at_stop(row[width:].tolist(), stops) for row in out]
        return outs

    with torch.inference_mode():  # warm-up, as for ours
        model.generate(torch.tensor([prompts[0]], device=dev), max_new_tokens=4, do_sample=False,
                       pad_token_id=pad_id, temperature=None, top_p=None, top_k=None)
    outs, wall, cpu = _timed(run)
    n = sum(len(o) for o in outs)
    return n / wall, n / max(cpu, 1e-9), outs
