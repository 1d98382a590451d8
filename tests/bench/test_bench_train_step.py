"""jobs/bench.py train-step: the bf16 setting steps the drafter and head in bf16 beside the fp32 one, on the same rows."""

from lilicorr.bench import train_step


def test_train_step_bench_times_fp32_and_bf16_on_the_same_rows():
    out = train_step.main(["--preset", "tiny-random", "--rows", "2", "--reps", "1", "--only", "5,7"])
    fp32, bf16 = out["cache, 128 anchors, vocab 8k"], out["cache, 128 anchors, vocab 8k, bf16"]
    for row in (fp32, bf16):
        assert row["s_per_step"] > 0 and row["blocks"] > 0 and row["positions"] > 0
    assert fp32["blocks"] == bf16["blocks"]  # the same rows and anchors: only the dtype differs
