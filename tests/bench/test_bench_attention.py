"""jobs/bench.py attention: both CPU attention paths of engine/attention.py, timed on the same caches, agree."""

from lilicorr.bench import attention


def test_attention_bench_times_both_paths_and_they_agree():
    res = attention.main(["--keys", "64,200", "--queries", "1,3", "--mb", "1", "--reps", "1", "--threads", "1"])
    assert [(c["keys"], c["queries"]) for c in res["cells"]] == [(64, 1), (64, 3), (200, 1), (200, 3)]
    for c in res["cells"]:
        assert c["sdpa_ms"] > 0 and c["stacked_matmul_ms"] > 0 and c["layers_cycled"] >= 2
        assert c["max_abs_diff"] < 1e-5
