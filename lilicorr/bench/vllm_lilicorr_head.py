"""Our LiLiCorr head against vLLM's own (not a test): `python jobs/bench.py vllm-lilicorr-head [--prompts 8 ...]`.

Issue 39 item 3; the method, step by step, and its results are docs/vllm-lilicorr.md's. A trained LiLiCorr export
goes to vLLM's layout (models/export.py `write_zlab`, default: every lossy conversion a shipped export needs, each
named in the JSON), and OUR engine decodes MT-Bench first turns (greedy, batch 1) from THAT folder, so it runs
exactly the model vLLM loads, while a DraftRunner observer records every block's lattice (the head's inputs and
its proposal). On those lattices: our reference path (`our_scores`; the engine's proposal must equal its walk),
vLLM's LiLiCorrHead, walk and candidate extraction (vllm_lilicorr_head_side.py in .venv-vllm, `make vllm-env`),
the worst score differences and the walks' agreement, and ours recomputed in each of vLLM's conventions (RMSNorm
eps, one unit normalisation, the shared slot bias) to say what each difference contributes. `--tau`: τ of our
engine for the model as trained and with only its draft vocabulary dropped, each with a digest of its outputs
(greedy is lossless: all equal); `--no-check`: only those runs.

Last stdout line: one JSON object (result.json beside it also holds the outputs and the export's warnings). Needs
.venv-vllm (`--skip-vllm`: ours only). On a CPU other jobs share, `--threads 1`: two torch threads on a shared core
stall each other (a block took seconds).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import time
from pathlib import Path

import torch

from lilicorr.bench.harness import json_line, load_bench_target, logger, mt_bench_prompt_ids, size_engine
from lilicorr.bench.vllm_peer import REPO, theirs

SIDE = Path(__file__).with_name("vllm_lilicorr_head_side.py")
TOL = 1e-4
_log = logger("vllm-lilicorr-head")


def decode(cfg, model, checkpoint: str, prompts, max_new: int, stops, record: bool = False) -> dict:
    """Our engine (system lilicorr, batch 1, greedy) on `checkpoint`: τ, outputs and, with `record`, every block's
    lattice as the head received it."""
    from lilicorr.engine.requests import Request
    from lilicorr.engine.systems import decoder_from_parts, decoder_parts
    from lilicorr.kernels.topk_logsoftmax import topk_logsoftmax_reference

    cfg = copy.deepcopy(cfg)
    size_engine(cfg, prompts, max_new, slack=16)
    cfg.engine.temperature = 0.0
    parts = decoder_parts(cfg, model, "lilicorr", checkpoint)
    head, blocks = parts.head, []
    dec = decoder_from_parts(parts, cfg, stop_ids=stops, max_batch=1)
    drafting = dec.runner.drafting
    if record:
        def recording(seen) -> None:  # a DraftRunner observer: the head's inputs and tokens of every block
            if drafting.vocab_ids is not None or seen.slot_logits.shape[0] != 1:
                raise RuntimeError("recording needs full-vocabulary logits at batch 1")
            top = topk_logsoftmax_reference(seen.slot_logits[0].float(), head.K)
            rows = seen.rows  # the head read these states (propose leaves them unchanged)
            blocks.append({"cand_ids": top.ids, "logprobs": top.logprobs, "slot_hidden": seen.slot_hidden[0].float(),
                           "target_state": drafting.target_state[rows][0].float(),
                           "anchor_hidden": drafting.context_state[rows][0].float(),
                           "engine_tokens": seen.proposal.tokens[0].long()})

        drafting.observers.append(recording)
    t0 = time.perf_counter()
    res = [dec.generate([Request(i, p, max_new_tokens=max_new)])[0] for i, p in enumerate(prompts)]
    wall = time.perf_counter() - t0
    n_blocks, acc = sum(r.blocks for r in res), sum(r.accepted_tokens for r in res)
    # wall_s includes the first calls' compilation (scripted layers, the head): not a speed figure
    out = {"tau": 1 + acc / n_blocks if n_blocks else None, "blocks": n_blocks,
           "outputs": [list(r.output_ids) for r in res], "wall_s": round(wall, 1)}
    if record:
        out["lattices"] = {k: torch.stack([b[k] for b in blocks]) for k in blocks[0]}
        out["head"] = head
    return out


def our_scores(head, lat: dict, eps=None, single_norm: bool = False):
    """Our reference path on recorded lattices -> (start (N, K), pair (N, S-1, K, K), path (N, S)), fp32.
    eps: every RMSNorm of the head at this eps (vLLM: the drafter's rms_norm_eps); single_norm: the vectors' one
    F.normalize only (vLLM's), not lattice_scores_reference's second unit normalisation."""
    from lilicorr.kernels.lattice import greedy_walk_reference, lattice_scores_reference
    from lilicorr.kernels.topk_logsoftmax import NUM_FEATURES, candidate_features
    from lilicorr.models.drafter_layers import RMSNorm

    head = copy.deepcopy(head).float().eval()
    for m in head.modules():
        if isinstance(m, RMSNorm) and eps is not None:
            m.eps = eps
    n, s, k = lat["cand_ids"].shape
    with torch.no_grad():
        feats = candidate_features(lat["logprobs"].reshape(n * s, k)).view(n, s, k, NUM_FEATURES)
        o, i, a = head.vectors(lat["cand_ids"], feats, lat["slot_hidden"], lat["target_state"], lat["anchor_hidden"])
        if single_norm:
            sigma = head.cfg.sigma
            start = sigma * torch.einsum("cd,ckd->ck", a.float(), i[:, 0].float())
            pair = sigma * torch.einsum("cskd,csjd->cskj", o[:, :-1].float(), i[:, 1:].float())
        else:
            start, pair = lattice_scores_reference(o, i, a, head.cfg.sigma)
    return start, pair, greedy_walk_reference(start, pair)


def compare(a, b) -> dict:
    """Two (start, pair, path) triples -> worst differences and walk agreement."""
    agree = int((a[2] == b[2]).all(-1).sum())
    return {"worst_start_diff": float((a[0] - b[0]).abs().max()), "worst_pair_diff": float((a[1] - b[1]).abs().max()),
            "walk_agree": f"{agree}/{a[2].shape[0]}", "walk_agree_blocks": agree}


def _ours_layout_without_draft_vocab(src: str, dst: Path) -> str:
    """Our layout minus drafter.draft_ids (the `full-vocab` conversion alone, per-layer slot biases kept): our engine
    can run it (vLLM cannot: two differing bias tables)."""
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    t = load_file(str(Path(src) / "model.safetensors"))
    t.pop("drafter.draft_ids", None)
    save_file(t, str(dst / "model.safetensors"), metadata={"format": "lilicorr-drafter-head-v1"})
    (dst / "config.json").write_text((Path(src) / "config.json").read_text())
    return str(dst)


def main(argv: list[str] | None = None) -> dict:
    import transformers

    from lilicorr.models.export import CONVERSIONS, conversions, read_export, write_zlab
    from lilicorr.platform.shipped import shipped_checkpoint

    ap = argparse.ArgumentParser(prog="bench.py vllm-lilicorr-head", description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", default=None, help="a LiLiCorr export, our layout (default: the shipped one)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--convert", default=None, metavar="NAME[,NAME]",
                    help=f"export conversions ({', '.join(CONVERSIONS)}); default: every one the checkpoint needs")
    ap.add_argument("--out", default=str(REPO / "outputs" / "vllm-lilicorr-head"), help="folder for the files")
    ap.add_argument("--threads", type=int, default=2,
                    help="torch threads, both sides (1 when other jobs hold cores: 2 threads on a shared core stall)")
    ap.add_argument("--tau", default="as_trained,full-vocab", metavar="RUN[,RUN]",
                    help="extra engine runs for τ: as_trained (the checkpoint itself), full-vocab (its draft "
                         "vocabulary dropped, per-layer slot biases kept: our engine only); '' for none")
    ap.add_argument("--no-check", action="store_true", help="no lattices, no vLLM: only the --tau runs")
    ap.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    ap.add_argument("--timeout", type=int, default=900, help="seconds for the vLLM side")
    ap.add_argument("--skip-vllm", action="store_true", help="ours only (no .venv-vllm needed)")
    args = ap.parse_args(argv)
    if not (args.skip_vllm or args.no_check) and not Path(args.vllm_python).exists():
        raise SystemExit(f"no {args.vllm_python}: build the vLLM environment first (make vllm-env)")
    checkpoint = args.checkpoint or shipped_checkpoint("smollm2-135m", "lilicorr")
    ex = read_export(checkpoint)
    if ex.meta.head_kind != "lilicorr":
        raise SystemExit(f"{checkpoint} holds head {ex.meta.head_kind!r}, not lilicorr")
    convert = conversions(ex, list(CONVERSIONS) if args.convert is None else [c for c in args.convert.split(",") if c])
    # the engine's settings; the target is the preset's (SmolLM2-135M, fp32); the drafter's full vocabulary, which
    # vLLM's head computes its candidates over (no run-time draft vocabulary)
    cfg, model, tok, stops = load_bench_target("smollm2-135m", ["engine.draft_vocab=0"], args.threads)
    prompts = mt_bench_prompt_ids(tok, args.prompts)  # no fallback to random tokens (bench_prompts has one)
    if len(prompts) < args.prompts:
        raise SystemExit(f"only {len(prompts)} MT-Bench prompts available, {args.prompts} asked")
    out = Path(args.out)
    zdir = out / "export"
    warnings = write_zlab(ex, zdir, model.config, stops, model.get_output_embeddings().weight, convert=convert)
    _log(f"{checkpoint} -> {zdir} (conversions: {convert or 'none'}); {len(prompts)} prompts x {args.max_new_tokens}")

    tau_runs = [t for t in args.tau.split(",") if t]
    if set(tau_runs) - {"as_trained", "full-vocab"}:
        raise SystemExit(f"--tau: unknown {sorted(set(tau_runs) - {'as_trained', 'full-vocab'})}")
    res = {"bench": "vllm-lilicorr-head", "checkpoint": str(checkpoint), "conversions": convert,
           "export_warnings": len(warnings), "prompts": len(prompts), "prompt_set": "mt-bench first turns",
           "max_new_tokens": args.max_new_tokens, "threads": args.threads}
    tau = {}
    if not args.no_check:
        tau["+".join(convert) or "export"] = check(args, res, cfg, model, ex, zdir, prompts, stops, convert)
    # groundwork for item 4: τ of the model as trained and with the draft vocabulary dropped alone
    if "as_trained" in tau_runs:
        tau["as_trained"] = decode(cfg, model, str(checkpoint), prompts, args.max_new_tokens, stops)
    if "full-vocab" in tau_runs:
        tau["full-vocab"] = decode(cfg, model, _ours_layout_without_draft_vocab(checkpoint, out / "full-vocab"),
                                   prompts, args.max_new_tokens, stops)
    # outputs_sha1: the outputs' digest, to compare runs of separate invocations (greedy is lossless: all equal)
    res["tau"] = {k: {"tau": round(v["tau"], 4), "blocks": v["blocks"], "outputs": v["outputs"],
                      "outputs_sha1": hashlib.sha1(json.dumps(v["outputs"]).encode()).hexdigest()[:12]}
                  for k, v in tau.items()}
    res.update({"torch_version": torch.__version__, "transformers_version": transformers.__version__,
                "load_average": [round(x, 2) for x in os.getloadavg()]})
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps({**res, "export_warnings": warnings}, indent=2))
    for v in res["tau"].values():  # the outputs stay in result.json (compare runs: greedy is lossless)
        v.pop("outputs")
    return json_line(res, load_average=False)  # already in res, rounded


def check(args, res: dict, cfg, model, ex, zdir: Path, prompts, stops, convert) -> dict:
    """The cross-check proper (module doc): fills `res`, returns our engine's run on the export (τ, outputs)."""
    from lilicorr.engine.systems import get_system, load_draft_model
    from lilicorr.models.export import LILICORR_RMS_EPS
    from lilicorr.platform.assets import smollm2_dir

    out = Path(args.out)
    run = decode(cfg, model, str(zdir), prompts, args.max_new_tokens, stops, record=True)
    lat = run.pop("lattices")
    run.pop("head")  # the engine's: its linears may be packed (oneDNN), which a copy cannot read; a fresh one
    head = load_draft_model(cfg, model, get_system("lilicorr"), str(zdir))[1].float().eval()
    n = lat["cand_ids"].shape[0]
    _log(f"ours on the export: {n} blocks, τ {run['tau']:.3f}")
    ours = our_scores(head, lat)
    eps = float(json.loads((zdir / "config.json").read_text())["rms_norm_eps"])
    engine_tokens = lat["cand_ids"].gather(2, ours[2][:, :, None])[:, :, 0]
    res.update({"blocks": n, "dtype": "float32", "tolerance": TOL, "block_size": ex.cfg.drafter.block_size,
                "top_k": head.K, "lattice_layers": head.cfg.num_layers,
                "engine_equal_reference": f"{int((engine_tokens == lat['engine_tokens']).all(-1).sum())}/{n}",
                "rms_norm_eps": {"ours": LILICORR_RMS_EPS, "vllm": eps}})

    # ours, converted to vLLM's conventions one at a time and together (each against ours as is)
    variants = {"eps": our_scores(head, lat, eps=eps), "single_norm": our_scores(head, lat, single_norm=True),
                "eps+single_norm": our_scores(head, lat, eps=eps, single_norm=True)}
    if "shared-slot-bias" in convert:  # the head as trained: its own per-layer tables on the same lattices
        trained = copy.deepcopy(head)
        state = {k: v for k, v in ex.head_state.items() if ".bias." in k}
        trained.load_state_dict(state, strict=False)
        variants["trained_slot_bias"] = our_scores(trained, lat)
    res["ours_vs_ours_converted"] = {k: compare(ours, v) for k, v in variants.items()}

    torch.save({k: lat[k] for k in ("cand_ids", "logprobs", "slot_hidden", "anchor_hidden")}, out / "lattices.pt")
    if not args.skip_vllm:
        spec = {"export": str(zdir.resolve()), "target": str(smollm2_dir()),
                "lattices": str((out / "lattices.pt").resolve()), "out": str((out / "theirs.pt").resolve()),
                "threads": args.threads}
        side = theirs(args.vllm_python, spec, args.timeout, script=SIDE)
        got = torch.load(out / "theirs.pt", weights_only=True)
        th = (got["start"], got["pair"], got["path"])
        res.update(compare(ours, th))
        same = (got["cand_ids"] == lat["cand_ids"]).all(-1).all(-1)  # per block: every slot's K ids, in order
        res["vllm_candidates"] = {"blocks_equal": f"{int(same.sum())}/{n}",
                                  "worst_logprob_diff": float((got["logprobs"] - lat["logprobs"])[same].abs().max())
                                  if same.any() else None}
        res["within_tolerance"] = res["worst_start_diff"] <= TOL and res["worst_pair_diff"] <= TOL
        res["vllm_vs_ours_converted"] = {k: compare(v, th) for k, v in variants.items()}
        res.update({"vllm_version": side["vllm_version"], "vllm_torch_version": side["torch_version"],
                    "vllm_head_parameters": side["head_parameters"], "vllm_head_tensors": side["head_tensors"]})
    res["head_parameters"] = sum(p.numel() for p in head.parameters())
    return run
