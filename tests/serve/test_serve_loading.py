"""Which systems a replica serves from which checkpoints, and the `serve run` builder's arguments (no Ray start)."""

from __future__ import annotations

import json

import pytest

from lilicorr.serve_apps.loading import ServeSpec, resolve_checkpoints


def _export(path, head_kind):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"head_kind": head_kind}))
    return str(path)


def test_shipped_checkpoints_are_the_default(tmp_path):
    root = tmp_path / "checkpoints"
    lil = _export(root / "smollm2-135m" / "lilicorr", "lilicorr")
    spec = ServeSpec(systems=["lilicorr", "lilicorr-viterbi", "dflash", "ar"], checkpoint_root=str(root))
    # dflash has neither a checkpoint nor --drafter random: left out; viterbi reads lilicorr's export
    assert resolve_checkpoints(spec) == {"lilicorr": lil, "lilicorr-viterbi": lil, "ar": None}


def test_given_checkpoints_win_and_random_fills_the_rest(tmp_path):
    root = tmp_path / "checkpoints"
    _export(root / "smollm2-135m" / "lilicorr", "lilicorr")
    mine = _export(tmp_path / "mine", "lilicorr")
    dfl = _export(tmp_path / "dfl", "none")
    spec = ServeSpec(systems=["lilicorr", "dflash", "domino"], checkpoints=[mine, f"dflash={dfl}"],
                     drafter="random", checkpoint_root=str(root))
    assert resolve_checkpoints(spec) == {"lilicorr": mine, "dflash": dfl, "domino": None}


def test_bad_inputs_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="unknown system 'nope'"):
        resolve_checkpoints(ServeSpec(systems=["nope"]))
    with pytest.raises(ValueError, match="is not a folder"):
        resolve_checkpoints(ServeSpec(systems=["lilicorr"], checkpoints=[str(tmp_path / "missing")]))
    with pytest.raises(ValueError, match="none of the systems"):
        resolve_checkpoints(ServeSpec(systems=["dflash"], checkpoint_root=str(tmp_path)))


def test_serve_run_builder_arguments():
    from lilicorr.serve_apps.deployment import app_builder

    app = app_builder({"preset": "tiny-random", "systems": "ar, lilicorr", "drafter": "random",
                       "overrides": ["engine.max_batch_size=2"], "num_replicas": 2, "num_cpus": 1})
    dep = app._bound_deployment
    assert dep.num_replicas == 2 and dep.ray_actor_options["num_cpus"] == 1.0
    spec = dep.init_args[0]
    assert spec["systems"] == ["ar", "lilicorr"] and spec["overrides"] == ["engine.max_batch_size=2"]
    with pytest.raises(ValueError, match="unknown serve args"):
        app_builder({"preset": "tiny-random", "sytems": "ar"})


@pytest.mark.parametrize("path", ["infra/serve-config.yaml", "infra/kuberay-rayservice.yaml"])
def test_serve_configs_fit_serve_schema_and_builder(path):
    from pathlib import Path

    import yaml
    from ray.serve.schema import ServeDeploySchema

    from lilicorr.serve_apps.deployment import app_builder

    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / path).read_text())
    if doc.get("kind") == "RayService":
        doc = yaml.safe_load(doc["spec"]["serveConfigV2"])
    config = ServeDeploySchema.model_validate(doc)
    (app,) = config.applications
    assert app.import_path == "lilicorr.serve_apps.deployment:app_builder"
    app_builder(app.args)  # every arg is a ServeSpec field or a sizing one
    if path == "infra/serve-config.yaml":
        assert config.http_options.host == "127.0.0.1"


def test_builder_carries_the_gpu_reservation_and_autoscaling_into_the_replica():
    from lilicorr.serve_apps.deployment import app_builder

    auto = {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 6}
    dep = app_builder({"preset": "tiny-random", "systems": "ar", "num_gpus": 1, "autoscaling_config": auto,
                       "device": "cuda"})._bound_deployment
    assert dep.ray_actor_options["num_gpus"] == 1.0 and dep.init_args[0]["num_gpus"] == 1.0
    assert dep.init_args[0]["device"] == "cuda"
    a = dep._deployment_config.autoscaling_config
    assert (a.min_replicas, a.max_replicas, a.target_ongoing_requests) == (1, 3, 6.0)
    cpu = app_builder({"preset": "tiny-random", "systems": "ar"})._bound_deployment
    assert cpu.init_args[0]["num_gpus"] == 0.0 and "num_gpus" not in cpu.ray_actor_options
    with pytest.raises(ValueError, match="not both"):
        app_builder({"preset": "tiny-random", "num_replicas": 2, "autoscaling_config": auto})
