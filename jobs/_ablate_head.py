"""The runs behind jobs/ablate_head.py (its docstring says what they compare): data, the warm drafter, one
training curve per (variant, seed), the summary. Heavy imports live here, so the job rejects a bad command
line before paying for them."""

from __future__ import annotations

import copy
import json
import os
import statistics
import time

import torch
from safetensors.torch import load_file, save_file

from lilicorr.config import load_config
from lilicorr.models.heads.lilicorr import LILICORR_CHOICES
from lilicorr.models.joint import JointModel
from lilicorr.models.target import build_random_target
from lilicorr.platform.assets import load_target, sharegpt_parquet
from lilicorr.platform.train.schedule import StepPlan, apply_lr, lr_factor


def conversation_rows(tokenizer, n: int, seq_len: int, skip: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input_ids (T,), loss_mask (T,)) for n ShareGPT first exchanges: loss on the answer tokens only."""
    import pyarrow.parquet as pq

    table = pq.read_table(str(sharegpt_parquet()), columns=["messages"]).slice(skip, 20 * n + 200)
    rows = []
    for messages in table.column("messages").to_pylist():
        if len(messages) < 2 or messages[0]["role"] != "user" or messages[1]["role"] != "assistant":
            continue
        prompt = tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(messages[:2], tokenize=False)
        p = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        ids = tokenizer(full, add_special_tokens=False)["input_ids"][:seq_len]
        if p > seq_len // 2 or len(ids) - p < 32:  # keep rows with a real answer inside the window
            continue
        ids = torch.tensor(ids)
        mask = torch.arange(len(ids)) >= p
        rows.append((ids, mask))
        if len(rows) == n:
            break
    if len(rows) < n:
        raise ValueError(f"only {len(rows)} usable ShareGPT rows, wanted {n}")
    return rows


@torch.no_grad()
def varied_target(target_cfg, seed: int = 1, logit_scale: float = 5.0):
    """A random target with structure: weights ~ N(0, 1/fan_in), embeddings ~ N(0, 1) (the default N(0, 0.02)
    init gives near-uniform logits whose argmax just repeats the last token: nothing for a head to learn)."""
    model = build_random_target(target_cfg)
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.dim() == 2:
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    model.model.embed_tokens.weight.copy_(torch.randn(model.model.embed_tokens.weight.shape, generator=g))
    if not target_cfg.tie_word_embeddings:  # tied N(0, 1) rows make every argmax repeat the current token
        model.get_output_embeddings().weight.mul_(logit_scale)
    return model.eval().requires_grad_(False)


@torch.no_grad()
def sampled_rows(hf_model, n: int, seq_len: int, prompt_len: int, temperature: float, seed: int):
    """(input_ids (T,), loss_mask (T,)) rows the target writes itself from random prompts (loss on its part):
    the regenerated-data setting of the paper, for a target without a chat template (tiny-random)."""
    g = torch.Generator().manual_seed(seed)
    V = hf_model.config.vocab_size
    prompts = torch.randint(0, V, (n, prompt_len), generator=g)
    ids = prompts
    for _ in range(seq_len - prompt_len):  # plain sampling loop: a few ms per token at tiny sizes
        logits = hf_model(input_ids=ids).logits[:, -1].float() / temperature
        u = torch.rand(logits.shape, generator=g).clamp_min(1e-20)
        ids = torch.cat([ids, (logits - torch.log(-torch.log(u))).argmax(-1, keepdim=True)], dim=1)  # Gumbel-max
    mask = torch.arange(seq_len) >= prompt_len
    return [(row, mask.clone()) for row in ids]


@torch.no_grad()
def target_passes(joint: JointModel, rows):
    return [joint.target.teacher_forced(ids[None]) for ids, _ in rows]


def batches(rows, passes, batch_size: int, step: int):
    """Rows of step `step` in a fixed cyclic order (the same for every run): one (ids, mask, pass) per row."""
    n = len(rows)
    return [(rows[(step * batch_size + j) % n], passes[(step * batch_size + j) % n]) for j in range(batch_size)]


@torch.no_grad()
def validate(joint: JointModel, rows, passes) -> dict[str, float]:
    joint.eval()
    sums, weight = {}, 0.0
    for i, ((ids, mask), tp) in enumerate(zip(rows, passes)):
        out = joint(ids[None], mask[None], generator=torch.Generator().manual_seed(10_000 + i), features=tp)
        w = out.metrics["blocks"]
        weight += w
        for k in ("sim_acceptance_length", "head_top1_oracle", "per_slot_accuracy"):
            if k in out.metrics:
                sums[k] = sums.get(k, 0.0) + out.metrics[k] * w
    joint.train()
    return {k: v / weight for k, v in sums.items()}


def train_run(joint: JointModel, train_rows, train_passes, val_rows, val_passes, steps: int, batch_size: int,
              eval_every: int, seed: int, log=print) -> list[dict]:
    """Train `joint` in place; returns the validation curve [{step, tau, ...}]."""
    groups = joint.param_groups(joint.cfg.optim)
    base_lrs = [g["lr"] for g in groups]
    opt = torch.optim.AdamW(groups, betas=joint.cfg.optim.betas)
    # linear warmup, then cosine to zero (the training job's schedule)
    plan = StepPlan(world_size=1, micro_batch=batch_size, steps_per_epoch=steps, total_steps=steps,
                    warmup_steps=max(1, int(joint.cfg.optim.warmup_fraction * steps)))
    gen = torch.Generator().manual_seed(seed)
    curve = []
    params = [p for g in groups for p in g["params"]]
    for step in range(steps):
        apply_lr(opt.param_groups, base_lrs, lr_factor(step, plan))
        opt.zero_grad(set_to_none=True)
        for (ids, mask), tp in batches(train_rows, train_passes, batch_size, step):
            out = joint(ids[None], mask[None], generator=gen, progress=step / steps, with_metrics=False, features=tp)
            (out.loss / batch_size).backward()
        torch.nn.utils.clip_grad_norm_(params, joint.cfg.optim.grad_clip)
        opt.step()
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            v = validate(joint, val_rows, val_passes)
            curve.append({"step": step + 1, "tau": v["sim_acceptance_length"], **v})
            log(f"  step {step + 1}: tau {v['sim_acceptance_length']:.4f} "
                f"head_top1 {v.get('head_top1_oracle', float('nan')):.3f}")
    return curve


def _sd(xs):
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def summarise(results: dict) -> dict:
    """Per variant: final and last-half tau (mean ± std over seeds), and the same paired with base by seed."""
    def per_seed(runs):
        return {r["seed"]: (r["curve"][-1]["tau"],
                            statistics.mean(p["tau"] for p in r["curve"][len(r["curve"]) // 2:])) for r in runs}

    base = per_seed(results.get("base", []))
    out = {}
    for name, runs in results.items():
        mine = per_seed(runs)
        finals, tails = [v[0] for v in mine.values()], [v[1] for v in mine.values()]
        d_final = [mine[s][0] - base[s][0] for s in mine if s in base]
        d_tail = [mine[s][1] - base[s][1] for s in mine if s in base]
        top1 = [r["curve"][-1].get("head_top1_oracle", float("nan")) for r in runs]
        out[name] = {"final_mean": statistics.mean(finals), "final_std": _sd(finals),
                     "head_top1_mean": statistics.mean(top1), "head_top1_std": _sd(top1),
                     "tail_mean": statistics.mean(tails), "tail_std": _sd(tails), "finals": finals,
                     "delta_final_mean": statistics.mean(d_final) if d_final else 0.0, "delta_final_std": _sd(d_final),
                     "delta_tail_mean": statistics.mean(d_tail) if d_tail else 0.0, "delta_tail_std": _sd(d_tail)}
    return out


def run(args, cfg_overrides: list[str]) -> int:
    """The comparison (jobs/ablate_head.py parses the command line, then calls this)."""
    torch.set_num_threads(args.threads)
    t0 = time.time()

    ours = [f"head.{k}={v[0]}" for k, v in LILICORR_CHOICES.items()]
    cfg = load_config(args.preset, ["head.kind=lilicorr", *ours, *cfg_overrides])
    n = args.train_rows + args.val_rows
    if cfg.target.source == "random":  # no chat template, no meaningful text: rows the target samples itself
        hf_model = varied_target(cfg.target)  # any vocab size, no tokenizer
        rows = sampled_rows(hf_model, n, args.seq_len, 16, args.temperature, seed=1234)
    else:
        hf_model, tokenizer = load_target(cfg.target)
        rows = conversation_rows(tokenizer, n, args.seq_len)
    train_rows, val_rows = rows[:args.train_rows], rows[args.train_rows:]

    # Warm the drafter once as vanilla DFlash (seed 0), shared by every run.
    warm_cfg = copy.deepcopy(cfg)
    warm_cfg.head.kind = "none"
    if args.warm_lr:
        warm_cfg.optim.lr_drafter = args.warm_lr
    torch.manual_seed(0)
    warm = JointModel(warm_cfg, hf_model)
    train_passes, val_passes = target_passes(warm, train_rows), target_passes(warm, val_rows)
    print(f"data: {len(train_rows)} train / {len(val_rows)} val rows, target passes cached "
          f"({time.time() - t0:.0f}s)", flush=True)
    if args.warm_cache and os.path.exists(args.warm_cache):
        warm.drafter.load_state_dict(load_file(args.warm_cache))
        print(f"warm drafter read from {args.warm_cache}: tau {validate(warm, val_rows, val_passes)}", flush=True)
    elif args.warm_steps:
        print(f"warming the drafter: {args.warm_steps} vanilla DFlash steps", flush=True)
        train_run(warm, train_rows, train_passes, val_rows, val_passes, args.warm_steps, args.batch_size,
                  max(1, args.warm_steps // 4), seed=0)
        if args.warm_cache:
            save_file({k: v.contiguous() for k, v in warm.drafter.state_dict().items()}, args.warm_cache)
    drafter_state = {k: v.clone() for k, v in warm.drafter.state_dict().items()}
    del warm

    variants = {} if args.skip_base else {"base": {}}
    for key in [c for c in (args.choices or ",".join(LILICORR_CHOICES)).split(",") if c]:
        ours, theirs = LILICORR_CHOICES[key]
        variants[f"{key}={theirs}"] = {key: theirs}
    results = {}
    for name, change in variants.items():
        results[name] = []
        for seed in [int(s) for s in args.seeds.split(",")]:
            run_cfg = copy.deepcopy(cfg)
            for k, v in change.items():
                setattr(run_cfg.head, k, v)
            torch.manual_seed(seed)
            joint = JointModel(run_cfg, hf_model)
            joint.drafter.load_state_dict(drafter_state)
            t = time.time()
            print(f"{name} seed {seed}", flush=True)
            curve = train_run(joint, train_rows, train_passes, val_rows, val_passes, args.steps, args.batch_size,
                              args.eval_every, seed)
            results[name].append({"seed": seed, "curve": curve, "seconds": time.time() - t,
                                  "head_params": sum(p.numel() for p in joint.head.parameters())})
            with open(args.out, "w") as f:  # after every run: a comparison cut short keeps the runs it finished
                json.dump({"args": vars(args), "results": results, "summary": summarise(results)}, f, indent=1)
    summary = summarise(results)
    print(f"\nvalidation tau after {args.steps} steps, mean ± std over seeds {args.seeds} "
          f"({time.time() - t0:.0f}s total):")
    for name, s in summary.items():
        print(f"  {name:28s} final {s['final_mean']:.4f} ± {s['final_std']:.4f}   "
              f"last-half mean {s['tail_mean']:.4f} ± {s['tail_std']:.4f}   "
              f"vs base (paired) {s['delta_final_mean']:+.4f} ± {s['delta_final_std']:.4f}   "
              f"head top-1 on oracle slots {s['head_top1_mean']:.3f} ± {s['head_top1_std']:.3f}")
    return 0

