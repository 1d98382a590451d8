"""Checks a sweep makes before Ray starts: the corpus exists and validation can score it.

A sweep's objective (`sweep.metric`, validation τ) is computed on the corpus's held-out rows. Without
any, or with none validation can score (a row needs two consecutive supervised tokens inside
`train.seq_len` to anchor a block), every trial trains for minutes and then reports no objective, and
Ray Tune fails with "Trial returned a result which did not include the specified metric(s)". Counting
the rows takes a second here (the held-out split is small); the error names the corpus, the counts and
the fix.
"""

from __future__ import annotations

from lilicorr.config import Config


class CorpusError(ValueError):
    """The corpus cannot give the objective this job needs (message: what, how many, the fix)."""


def scorable_heldout_rows(cfg: Config) -> tuple[int, int]:
    """(held-out rows, rows validation scores) with the selection and anchor rule training uses."""
    import torch  # noqa: F401  (plan_batches draws anchors with torch)

    from lilicorr.platform.train.data import iter_rows_local, split_files
    from lilicorr.platform.train.validate import plan_batches, select_rows

    files = split_files(cfg.data.output_dir, "heldout")
    if not files:
        return 0, 0
    rows = list(iter_rows_local(files))
    chosen = select_rows(rows, cfg.train.val_max_rows)
    planned = plan_batches(chosen, cfg.train.seq_len, cfg.train.seed, cfg.drafter.anchors_per_seq, 1)
    return len(rows), sum(len(b) for b in planned)


def require_validation_corpus(cfg: Config, job: str = "sweep") -> int:
    """Raise CorpusError unless the corpus has training shards and at least one held-out row validation
    can score. Returns that row count."""
    from lilicorr.platform.train.data import require_train_files

    data = cfg.data.output_dir
    try:
        require_train_files(data)  # its message names the folder and jobs/regenerate.py
    except FileNotFoundError as e:
        raise CorpusError(f"{job}: {e}") from e
    heldout, scorable = scorable_heldout_rows(cfg)
    fix = (f"regenerate with a larger data.heldout_fraction (now {cfg.data.heldout_fraction:g}) or more rows "
           f"(data.limit=...), e.g. jobs/regenerate.py --preset {cfg.preset} data.output_dir={data} "
           f"data.heldout_fraction=0.2")
    if heldout == 0:
        raise CorpusError(f"{job}: its objective {cfg.sweep.metric} is measured on held-out rows, and corpus "
                          f"{data} has 0 held-out rows ({data}/heldout/*.parquet); {fix}")
    if scorable == 0:
        raise CorpusError(f"{job}: its objective {cfg.sweep.metric} is measured on held-out rows, and none of the "
                          f"{heldout} held-out rows of corpus {data} can be scored (a row needs two consecutive "
                          f"supervised tokens within train.seq_len={cfg.train.seq_len}"
                          + (f" among the train.val_max_rows={cfg.train.val_max_rows} chosen" if cfg.train.val_max_rows
                             else "") + f"); {fix}")
    return scorable
