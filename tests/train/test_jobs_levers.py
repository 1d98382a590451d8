"""jobs/compare_levers.py reads learning curves and step costs from training logs."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from jobs.compare_levers import LEVERS, curve, mixed_data_dir, seconds_per_step, tokens_per_step  # noqa: E402

LOG = """[train] head none: 100 steps of 4 rows
[train] step 5/100 loss 9.0 dflash 9.0 lr 1.00e-03 acc 0.000 tok/s 115 (20 s)
[train] step 10/100 loss 8.0 dflash 8.0 lr 1.00e-03 acc 0.010 tok/s 115 (40 s)
[train] validation at step 10: loss 8.1 sim_acceptance_length 1.0500 oracle_prefix_coverage 0.02 (70 s)
[train] checkpoint at step 10 (71 s)
[train] step 15/100 loss 7.5 dflash 7.5 lr 1.00e-03 acc 0.020 tok/s 115 (91 s)
[train] step 20/100 loss 7.0 dflash 7.0 lr 1.00e-03 acc 0.030 tok/s 115 (111 s)
[train] validation at step 20: loss 7.2 sim_acceptance_length 1.0750 oracle_prefix_coverage 0.03 (140 s)
"""


def test_curve_and_step_cost_from_a_log(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(LOG)
    assert curve(log) == [(10, 1.05), (20, 1.075)]
    assert curve(log, "loss") == [(10, 8.1), (20, 7.2)]  # the validation loss, not the training loss
    # 5->10 (20 s) and 15->20 (20 s) count; 10->15 holds a validation and a checkpoint and does not
    assert seconds_per_step(log) == 4.0


def test_every_lever_but_the_base_changes_the_recipe():
    assert LEVERS["base"] == []
    assert all(LEVERS[k] for k in LEVERS if k != "base")


def test_regenerated_lever_data_shares_the_held_out_rows(tmp_path):
    from lilicorr.platform.train.shards import write_shards

    rows = [{"id": f"r{i}", "input_ids": list(range(n)), "loss_mask": [1] * n} for i, n in enumerate([10, 30, 500])]
    write_shards(rows, tmp_path / "regen", "train", 2)
    corpus = [{"id": f"r{i}", "input_ids": [7] * 50, "loss_mask": [1] * 50} for i in (0, 2, 9)]
    write_shards(corpus, tmp_path / "corpus", "train", 2)
    write_shards(rows[:1], tmp_path / "corpus", "heldout", 2)
    # 2 rows per step x mean of (10, 30, 384 cropped) = 282.67
    assert abs(tokens_per_step(tmp_path / "regen", 384, 2) - 2 * (10 + 30 + 384) / 3) < 1e-9
    regen, same = mixed_data_dir(tmp_path / "out", tmp_path / "regen", tmp_path / "corpus")
    assert sorted(p.name for p in (regen / "train").iterdir()) == ["shard-00000.parquet", "shard-00001.parquet"]
    for d in (regen, same):
        assert [p.name for p in (d / "heldout").iterdir()] == ["shard-00000.parquet"]
    # the corpus's rows of the regenerated conversations only (r0 and r2; r9 was not regenerated)
    assert tokens_per_step(same, 384, 1) == 50 and len(list((same / "train").glob("*.parquet"))) == 1
    import pyarrow.parquet as pq
    assert sorted(pq.read_table(next((same / "train").glob("*.parquet"))).column("id").to_pylist()) == ["r0", "r2"]
    assert mixed_data_dir(tmp_path / "out", tmp_path / "regen", tmp_path / "corpus") == (regen, same)  # reused
