"""`jobs/bench.py train-step`: the cost of one training step, live target pass vs feature cache, sparse vs
dense anchors, full vs reduced draft vocabulary, fp32 vs bf16 drafter + head (train.precision), side by side in one
run on the same rows (issues 11, 38).

    python jobs/bench.py train-step [--preset smollm2-135m] [--rows 4] [--reps 3] [--threads 2]

For each setting: median seconds per step (forward + backward of drafter + head, no optimizer), blocks and
supervised (block, slot) positions per step, and positions per second. The live setting runs the frozen
target's teacher-forced pass inside the step, as training without the cache does.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lilicorr.bench.harness import json_line

# (name, from the feature cache, anchors per row, draft vocabulary size or 0 = the target's whole vocabulary,
#  compact logits: a head's (C, S, .) logits over the draft vocabulary only, else full-vocabulary floors,
#  the drafter's and head's parameter dtype: bf16 is what train.precision=bf16 steps, as DeepSpeed casts them;
#  the frozen target stays fp32)
SETTINGS = [("live target, 16 anchors", False, 16, 0, True, torch.float32),
            ("cache, 16 anchors", True, 16, 0, True, torch.float32),
            ("live target, 128 anchors", False, 128, 0, True, torch.float32),
            ("cache, 128 anchors", True, 128, 0, True, torch.float32),
            ("cache, 128 anchors, vocab 8k", True, 128, 8192, True, torch.float32),
            ("cache, 128, vocab 8k, full-V logits", True, 128, 8192, False, torch.float32),
            ("cache, 128 anchors, vocab 8k, bf16", True, 128, 8192, True, torch.bfloat16)]


def _rows(tokenizer, n: int, seq_len: int):
    from lilicorr.platform.train.data import pad_rows
    from lilicorr.platform.train.shards import sharegpt_as_is_rows

    rows = sharegpt_as_is_rows(tokenizer, n, tokenizer.eos_token_id)
    return pad_rows([r["input_ids"] for r in rows], [r["loss_mask"] for r in rows], seq_len, True)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="smollm2-135m")
    p.add_argument("--head", default="lilicorr")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--only", default="", help="comma-separated setting numbers to run (1-based; default all)")
    args = p.parse_args(argv)
    only = {int(x) for x in args.only.split(",") if x}
    torch.set_num_threads(args.threads)
    from lilicorr.config import load_config
    from lilicorr.models.joint import JointModel
    from lilicorr.platform.assets import load_target

    out = {}
    for n, (name, cached, anchors, vocab, compact, dtype) in enumerate(SETTINGS, 1):
        if only and n not in only:
            continue
        cfg = load_config(args.preset, [f"head.kind={args.head}", f"drafter.anchors_per_seq={anchors}",
                                        f"drafter.draft_vocab={vocab}"])
        hf, tok = load_target(cfg.target)
        torch.manual_seed(0)
        joint = JointModel(cfg, hf)
        joint.head.compact_vocab = joint.head.compact_vocab and compact
        ids, mask = _rows(tok, args.rows, cfg.train.seq_len)
        if vocab:  # the cost does not depend on which ids: the rows' own tokens first, then the lowest others
            seen = torch.unique(ids[mask.bool()])
            rest = torch.ones(cfg.target.vocab_size, dtype=torch.bool)
            rest[seen] = False
            joint.drafter.set_draft_vocab(torch.cat([seen, rest.nonzero()[:, 0]])[:vocab])
        feats = joint.target.teacher_forced(ids) if cached else None
        joint.drafter.to(dtype)
        joint.head.to(dtype)
        times = []
        for r in range(args.reps + 1):  # the first repetition warms up
            t0 = time.perf_counter()
            res = joint(ids, mask, generator=torch.Generator().manual_seed(r), features=feats, with_metrics=False)
            res.loss.backward()
            joint.zero_grad(set_to_none=True)
            if r:
                times.append(time.perf_counter() - t0)
        with torch.no_grad():
            batch = joint.build_batch(ids, mask, torch.Generator().manual_seed(0), features=feats)
        sec = statistics.median(times)
        positions = int(batch.valid.sum())
        out[name] = {"s_per_step": round(sec, 3), "blocks": int(batch.labels.shape[0]), "positions": positions,
                     "positions_per_s": round(positions / sec, 1)}
        print(f"{name:<36} {sec:7.2f} s/step  {out[name]['blocks']:5d} blocks  {positions:6d} positions  "
              f"{positions / sec:8.1f} positions/s", flush=True)
    return json_line(out, load_average=False)
