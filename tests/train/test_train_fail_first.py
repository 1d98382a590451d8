"""Training over a folder with no shards stops before Ray or MLflow start, naming the folder and the fix."""

import sys

import pytest

from lilicorr.config import load_config


@pytest.fixture(autouse=True)
def no_ray_running():
    """An earlier module's Ray instance (the suite runs in one process; conftest's local_ray_2cpu stays up
    for the next module) would hide whether training started Ray: start from none."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def test_missing_training_shards_fail_before_ray(tmp_path):
    from lilicorr.platform.train.driver import train

    data = tmp_path / "not-regenerated"
    cfg = load_config("tiny-random", [f"data.output_dir={data}", f"train.output_dir={tmp_path / 'run'}",
                                      f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlruns.db'}"])
    with pytest.raises(FileNotFoundError) as err:
        train(cfg)
    assert str(data) in str(err.value) and "jobs/regenerate.py" in str(err.value)
    ray = sys.modules.get("ray")
    assert ray is None or not ray.is_initialized()
    assert not (tmp_path / "mlruns.db").exists() and not (tmp_path / "run").exists()
