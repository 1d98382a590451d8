"""jobs/bench.py head on the shipped DFlash export: every proposal it replays is the one the engine made."""

import pytest

from lilicorr.bench import head_cost
from lilicorr.platform.shipped import shipped_checkpoint


@pytest.mark.slow
def test_head_bench_replays_the_engines_proposals():
    assert shipped_checkpoint("smollm2-135m", "dflash") is not None, "the shipped DFlash export is missing"
    res = head_cost.main(["--systems", "dflash", "--prompts", "1", "--max-new-tokens", "12", "--rounds", "2"])
    (row,) = res["rows"]
    assert row["system"] == "dflash" and row["verify_tokens"] == 4  # engine.draft_tokens=3: anchor + 3 drafts
    assert 1 <= row["proposals"] <= row["blocks"]
    assert row["replays_equal"] == row["proposals"]
    assert row["warm_ms"] > 0 and row["after_target_pass_ms"] > 0 and row["target_pass_ms"] > row["warm_ms"]


def test_head_bench_rejects_zero_rounds():
    with pytest.raises(SystemExit):
        head_cost.main(["--rounds", "0"])
