"""The concurrency sweep (`jobs/bench.py concurrency`): entropy tiers by rank, the entropy the target's own
distribution gives (checked against a forward pass), and one small sweep through a real Serve app on
127.0.0.1 with a child MLflow run per cell and the speedups against AR at the same setting."""

import json

import mlflow
import pytest
import torch

from lilicorr.bench.concurrency import entropy_tiers, main, output_entropy


def test_tiers_are_equal_thirds_by_rank_even_for_ties():
    assert entropy_tiers([3.0, 1.0, 2.0, 5.0, 4.0, 0.5]) == ["mid", "low", "mid", "high", "high", "low"]
    assert entropy_tiers([1.0] * 6) == ["low", "low", "mid", "mid", "high", "high"]


def test_output_entropy_is_the_mean_entropy_along_the_greedy_answer(one_torch_thread):
    from lilicorr.config import load_config
    from lilicorr.platform.assets import load_target

    model, _ = load_target(load_config("tiny-random", []).target)
    prompts = [[5, 6, 7, 8], [9, 10]]
    got = output_entropy(model, prompts, tokens=3, stop_ids=[], batch=2)  # batched, left padded
    for p, e in zip(prompts, got):
        ids = torch.tensor([p])
        ents = []
        with torch.inference_mode():
            for _ in range(3):  # the greedy answer, one forward pass a token
                logp = model(ids).logits[0, -1].float().log_softmax(-1)
                ents.append(float(-(logp.exp() * logp).sum()))
                ids = torch.cat([ids, logp.argmax().view(1, 1)], 1)
        assert e == pytest.approx(sum(ents) / 3, rel=1e-4)


def test_a_small_sweep_through_the_serve_app(tmp_path, monkeypatch, one_torch_thread):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns.db")
    monkeypatch.chdir(tmp_path)  # the entropy cache goes under outputs/ here
    out = main(["--preset", "tiny-random", "--drafter", "random", "--systems", "dflash", "--concurrency", "1,2",
                "--tiers", "low", "--pool", "3", "--requests", "1", "--max-tokens", "4", "--out", str(tmp_path / "c"),
                "tracking.experiment=conc-test"])
    cells = out["cells"]
    assert out["errors"] == 0 and len(cells) == 4 and {c["system"] for c in cells} == {"ar", "dflash"}
    assert all(c["requests"] == c["concurrency"] for c in cells)
    for c in cells:  # speedup = tok/s over AR's at the same setting
        ar = next(a for a in cells if a["system"] == "ar" and a["concurrency"] == c["concurrency"])
        assert c["speedup"] == pytest.approx(c["tokens_per_s"] / ar["tokens_per_s"])
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlruns.db")
    kids = client.search_runs([client.get_run(out["mlflow_run_id"]).info.experiment_id],
                              f"tags.`mlflow.parentRunId` = '{out['mlflow_run_id']}'")
    assert len(kids) == 4 and all(r.data.metrics["errors"] == 0 for r in kids)
    assert "| chat | low | 2 |" in (tmp_path / "c" / "table.md").read_text()
    assert json.loads((tmp_path / "c" / "summary.json").read_text())["cells"] == cells
