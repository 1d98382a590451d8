"""Counting for regeneration: per-shard counts, the run summary, progress lines and MLflow logging."""

from __future__ import annotations

import collections
import json
import sys
import time
from typing import Any, Optional

from lilicorr.platform.regenerate.conversations import GENERATE_ERROR

ERROR_TEXT = 200  # characters of a failed call's message kept as its key: enough for "CUDA out of memory. Tried to..."


def shard_counts(table) -> dict[str, Any]:
    """Counts of one shard's actor output (skipped rows included), as stored in the manifest.

    `generate_errors` maps each failed generate call's message (cut to ERROR_TEXT characters) to the rows it
    skipped, so the summary says why rows are missing, not only how many.
    """
    rows = table.select(["split", "skip_reason", "skip_detail", "generated_tokens", "generate_seconds",
                         "turns_capped", "turns_dropped", "num_assistant_turns", "input_ids"]).to_pylist()
    kept = [r for r in rows if not r["skip_reason"]]
    errors = collections.Counter(r["skip_detail"][:ERROR_TEXT] for r in rows if r["skip_reason"] == GENERATE_ERROR)
    return {
        "rows_in": len(rows),
        "rows_out": {split: sum(1 for r in kept if r["split"] == split) for split in ("train", "heldout")},
        "skipped": dict(sorted(collections.Counter(r["skip_reason"] for r in rows if r["skip_reason"]).items())),
        "assistant_turns": sum(r["num_assistant_turns"] for r in kept),
        "turns_capped": sum(r["turns_capped"] for r in kept),
        "turns_dropped": sum(r["turns_dropped"] for r in kept),
        "generated_tokens": sum(r["generated_tokens"] for r in kept),
        "sequence_tokens": sum(len(r["input_ids"]) for r in kept),
        "generate_seconds": round(sum(r["generate_seconds"] for r in kept), 3),
        "generate_errors": dict(sorted(errors.items())),
    }


def total(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum of shard counts: numbers added, the per-split / per-reason / per-message counts merged by key."""
    out: dict[str, Any] = {"shards": len(entries), "rows_in": 0, "rows_out": {"train": 0, "heldout": 0},
                           "skipped": {}, "assistant_turns": 0, "turns_capped": 0, "turns_dropped": 0,
                           "generated_tokens": 0, "sequence_tokens": 0, "generate_seconds": 0.0,
                           "generate_errors": {}}
    for e in entries:
        for k, v in out.items():
            if isinstance(v, dict):
                for key, n in e.get(k, {}).items():  # generate_errors is absent in manifests older than it
                    v[key] = v.get(key, 0) + n
            elif k != "shards":
                out[k] += e.get(k, 0)
    out["skipped"] = dict(sorted(out["skipped"].items()))
    out["generate_errors"] = dict(collections.Counter(out["generate_errors"]).most_common())
    out["generate_seconds"] = round(out["generate_seconds"], 3)
    return out


class Progress:
    """Per-shard lines on stderr while the pipeline runs."""

    def __init__(self, num_shards: int, already_done: int):
        self.num_shards, self.done = num_shards, already_done
        self.t0 = time.perf_counter()
        self.tokens = 0

    def line(self, text: str) -> None:
        print(f"[regenerate] {text}", file=sys.stderr, flush=True)

    def shard_done(self, shard: int, start: int, stop: int, counts: dict[str, Any]) -> None:
        self.done += 1
        self.tokens += counts["generated_tokens"]
        elapsed = time.perf_counter() - self.t0
        skipped = sum(counts["skipped"].values())
        reasons = ", ".join(f"{k} {v}" for k, v in counts["skipped"].items())
        self.line(f"shard {shard:05d} rows [{start}, {stop}) done ({self.done}/{self.num_shards}): "
                  f"out {counts['rows_out']['train']} train + {counts['rows_out']['heldout']} heldout, "
                  f"skipped {skipped}{f' ({reasons})' if reasons else ''}; "
                  f"{counts['generated_tokens']} tokens generated; run {self.tokens / max(elapsed, 1e-9):.1f} tok/s, "
                  f"{elapsed:.0f}s elapsed")

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


def summary(all_counts: dict[str, Any], run_counts: dict[str, Any], run_seconds: float,
            output_dir: str) -> dict[str, Any]:
    """The figures a user reads at the end: the whole corpus so far, and this run's throughput."""
    return {
        "output_dir": output_dir,
        "corpus": all_counts,
        "this_run": {**run_counts, "wall_seconds": round(run_seconds, 2),
                     "tokens_per_second": round(run_counts["generated_tokens"] / max(run_seconds, 1e-9), 2),
                     "generate_tokens_per_second": round(
                         run_counts["generated_tokens"] / max(run_counts["generate_seconds"], 1e-9), 2)},
    }


def format_summary(s: dict[str, Any]) -> str:
    c, r = s["corpus"], s["this_run"]
    skipped = ", ".join(f"{k}: {v}" for k, v in c["skipped"].items()) or "none"
    errors = [f"    {n:6d} rows  {message}" for message, n in list(c.get("generate_errors", {}).items())[:5]]
    if errors:
        errors.insert(0, "  failed generate calls (their rows skipped; rerun with data.retry_failed=true):")
    return "\n".join([
        f"regeneration summary ({s['output_dir']})",
        f"  rows in        {c['rows_in']}  ({c['shards']} shards)",
        f"  rows out       {c['rows_out']['train']} train, {c['rows_out']['heldout']} heldout",
        f"  rows skipped   {sum(c['skipped'].values())}  ({skipped})",
        *errors,
        f"  assistant turns {c['assistant_turns']}  (capped at max_new_tokens: {c['turns_capped']}, "
        f"dropped for prompt length: {c['turns_dropped']})",
        f"  tokens         {c['generated_tokens']} generated, {c['sequence_tokens']} in sequences",
        f"  this run       {r['shards']} shards, {r['generated_tokens']} tokens in {r['wall_seconds']:.1f}s wall: "
        f"{r['tokens_per_second']:.1f} tok/s ({r['generate_tokens_per_second']:.1f} tok/s inside generate)",
    ])


def log_to_mlflow(s: dict[str, Any], samples: list[dict[str, Any]], manifest: Optional[dict[str, Any]]) -> None:
    """Metrics of the summary plus the sample conversations and the manifest as artifacts."""
    import mlflow

    c, r = s["corpus"], s["this_run"]
    metrics = {"rows_in": c["rows_in"], "rows_out_train": c["rows_out"]["train"],
               "rows_out_heldout": c["rows_out"]["heldout"], "rows_skipped": sum(c["skipped"].values()),
               "assistant_turns": c["assistant_turns"], "turns_capped": c["turns_capped"],
               "turns_dropped": c["turns_dropped"], "tokens_generated": c["generated_tokens"],
               "sequence_tokens": c["sequence_tokens"], "run_tokens_generated": r["generated_tokens"],
               "run_wall_seconds": r["wall_seconds"], "tokens_per_second": r["tokens_per_second"],
               "generate_tokens_per_second": r["generate_tokens_per_second"]}
    metrics.update({f"skipped_{k}": v for k, v in c["skipped"].items()})
    mlflow.log_metrics({k: float(v) for k, v in metrics.items()})
    mlflow.log_dict(s, "regenerate/summary.json")
    if manifest is not None:
        mlflow.log_dict(manifest, "regenerate/manifest.json")
    if samples:
        text = "\n".join(json.dumps(x, ensure_ascii=False) for x in samples) + "\n"
        mlflow.log_text(text, "regenerate/samples.jsonl")
