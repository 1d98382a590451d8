"""MLflow helper on a real sqlite store: params, tags, parent/child, retries, store checks, the registry."""

import mlflow
import pytest

from lilicorr.config import load_config
from lilicorr.platform.tracking import (GIT_TAG, PARENT_TAG, TrackingStoreError, artifact_location,
                                        check_cluster_store, child_env, make_run_name, run_key, start_run,
                                        tracking_uri)


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("store")  # one database for the module: creating one costs seconds


@pytest.fixture
def store(shared_dir, monkeypatch):
    monkeypatch.chdir(shared_dir)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("LILICORR_PARENT_RUN_ID", raising=False)
    return shared_dir


def test_run_records_config_params_and_tags(store):
    cfg = load_config("tiny-random", ["head.top_k=5"])
    with start_run(cfg, "unit-test") as run:
        mlflow.log_metric("loss", 0.5, step=1)
    assert (store / "mlruns.db").exists()
    got = mlflow.MlflowClient().get_run(run.info.run_id)
    assert got.data.params["head.top_k"] == "5"
    assert got.data.params["preset"] == "tiny-random"
    assert got.data.tags["job"] == "unit-test" and got.data.tags["preset"] == "tiny-random"
    commit = got.data.tags[GIT_TAG]
    assert len(commit) in (7, 40) or commit == "unknown"
    assert got.data.metrics["loss"] == 0.5
    assert got.info.run_name == "unit-test-tiny-random top_k=5"  # the override tells runs apart
    assert "config.json" in [a.path for a in mlflow.artifacts.list_artifacts(run_id=run.info.run_id)]
    # artifacts beside the database, not in ./mlruns of whatever cwd created the experiment
    assert got.info.artifact_uri.startswith((store / "mlartifacts").as_uri())


def test_env_uri_wins_and_config_wins_over_env(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////x/other.db")
    assert tracking_uri(load_config("tiny-random")) == "sqlite:////x/other.db"
    assert tracking_uri(load_config("tiny-random", ["tracking.tracking_uri=http://h:5000"])) == "http://h:5000"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert tracking_uri() == "sqlite:///mlruns.db"


def test_run_names_differ_by_head_and_overrides():
    a = make_run_name(load_config("tiny-random", ["head.kind=none"]), "train", ["none"])
    b = make_run_name(load_config("tiny-random"), "train", ["lilicorr"])
    c = make_run_name(load_config("tiny-random", ["train.max_steps=7", "train.output_dir=/x"]), "train", ["lilicorr"])
    assert len({a, b, c}) == 3
    assert c == "train-lilicorr-tiny-random max_steps=7"  # paths never enter a name


def test_stage_run_under_a_parent_is_its_child(store, monkeypatch):
    cfg = load_config("tiny-random", ["tracking.experiment=pipeline"])
    with start_run(cfg, "demo") as parent:
        env = child_env(parent)
    monkeypatch.setenv("LILICORR_PARENT_RUN_ID", env["LILICORR_PARENT_RUN_ID"])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    other = load_config("tiny-random", ["tracking.experiment=elsewhere"])  # a stage with its own experiment
    with start_run(other, "train") as child:
        pass
    got = mlflow.MlflowClient().get_run(child.info.run_id)
    assert got.data.tags[PARENT_TAG] == parent.info.run_id
    assert got.info.experiment_id == parent.info.experiment_id  # nested in the parent's experiment
    children = mlflow.search_runs([parent.info.experiment_id], output_format="list",
                                  filter_string=f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'")
    assert [r.info.run_id for r in children] == [child.info.run_id]


def test_retried_job_continues_its_unfinished_run(store):
    cfg = load_config("tiny-random", ["tracking.experiment=retries"])
    key = run_key(cfg, "train")
    with pytest.raises(RuntimeError):
        with start_run(cfg, "train", resume_key=key) as first:
            mlflow.log_metric("step", 1)
            raise RuntimeError("worker died")
    with start_run(cfg, "train", resume_key=key) as second:
        mlflow.log_metric("step", 2)
    assert second.info.run_id == first.info.run_id
    got = mlflow.MlflowClient().get_run(first.info.run_id)
    assert got.info.status == "FINISHED" and got.data.tags["lilicorr.resumed"] == "true"
    with start_run(cfg, "train", resume_key=key) as third:  # a finished run is never reopened
        pass
    assert third.info.run_id != first.info.run_id


def test_local_store_on_a_multi_node_cluster_fails_clearly(monkeypatch):
    monkeypatch.delenv("LILICORR_SHARED_STORE", raising=False)
    with pytest.raises(TrackingStoreError, match="3 nodes.*tracking server"):
        check_cluster_store("sqlite:////data/mlruns.db", num_nodes=3)
    check_cluster_store("sqlite:////data/mlruns.db", num_nodes=1)
    check_cluster_store("http://mlflow:5000", num_nodes=3)
    monkeypatch.setenv("LILICORR_SHARED_STORE", "1")
    check_cluster_store("sqlite:////shared/mlruns.db", num_nodes=3)


def test_absolute_sqlite_store_gets_artifacts_beside_it():
    assert artifact_location("sqlite:////srv/ml/runs.db") == "file:///srv/ml/mlartifacts"
    assert artifact_location("http://mlflow:5000") is None


def test_export_registered_and_loaded_by_model_uri_decodes_as_its_folder(store, tmp_path, one_torch_thread):
    import torch

    from lilicorr.engine.requests import Request
    from lilicorr.engine.systems import build_decoder
    from lilicorr.models.joint import JointModel
    from lilicorr.models.target import build_random_target
    from lilicorr.platform.tracking import register_export, resolve_checkpoint

    cfg = load_config("tiny-random", ["tracking.experiment=registry"])
    target = build_random_target(cfg.target)
    torch.manual_seed(3)
    folder = JointModel(cfg, target).export(tmp_path / "export")
    with start_run(cfg, "train") as run:
        mlflow.log_artifacts(str(folder), "export")
    version = register_export(run.info.run_id, "tiny-lilicorr")
    assert int(register_export(run.info.run_id, "tiny-lilicorr").version) == int(version.version) + 1
    local, source_run = resolve_checkpoint("models:/tiny-lilicorr@newest", dst_root=str(tmp_path / "dl"))
    assert source_run == run.info.run_id and local != str(folder)
    prompt = torch.randint(0, cfg.target.vocab_size, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    outs = []
    for ckpt in (str(folder), local):
        dec = build_decoder(cfg, target, "lilicorr", checkpoint=ckpt, max_batch=1)
        outs.append(dec.generate([Request(0, prompt, max_new_tokens=12)])[0].output_ids)
    assert outs[0] == outs[1] and len(outs[0]) == 12
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        resolve_checkpoint("models:/no-such-model@newest")


def test_training_run_carries_corpus_lineage_and_resumes_on_retry(store, tmp_path):
    from lilicorr.platform.train.driver import _mlflow_run
    from lilicorr.platform.tracking import FINGERPRINT_TAG, SOURCE_RUN_TAG, fingerprint_hash, write_lineage

    data = tmp_path / "corpus"
    data.mkdir()
    (data / "manifest.json").write_text('{"fingerprint": {"source": "embedded:sharegpt", "limit": 8}}')
    cfg = load_config("tiny-random", [f"data.output_dir={data}", "head.kind=none", "tracking.experiment=lineage"])
    with start_run(cfg, "regenerate") as regen:
        write_lineage(data, regen.info.run_id)
    with pytest.raises(RuntimeError):
        with _mlflow_run(cfg, None, True) as (first, _):
            raise RuntimeError("driver died")
    with _mlflow_run(cfg, None, True) as (second, uri):
        pass
    assert second == first  # the retried job continued its run
    run = mlflow.MlflowClient(uri).get_run(second)
    assert run.info.run_name == "train-none-tiny-random" and run.info.status == "FINISHED"
    assert run.data.tags[SOURCE_RUN_TAG] == regen.info.run_id
    assert run.data.tags[FINGERPRINT_TAG] == fingerprint_hash({"source": "embedded:sharegpt", "limit": 8})


def test_platform_experiment_opens_on_runs_not_the_genai_overview(store):
    from lilicorr.platform.tracking import EXPERIMENT_KIND_TAG

    assert EXPERIMENT_KIND_TAG == "mlflow.experimentKind"  # the tag MLflow 3.17's UI reads (ExperimentKind)
    with start_run(load_config("tiny-random", ["tracking.experiment=kind-new"]), "unit-test"):
        pass
    client = mlflow.MlflowClient()
    assert client.get_experiment_by_name("kind-new").tags[EXPERIMENT_KIND_TAG] == "custom_model_development"
    # an experiment made before the tag gets it; a kind somebody chose stays
    old = client.create_experiment("kind-old")
    chosen = client.create_experiment("kind-chosen", tags={EXPERIMENT_KIND_TAG: "genai_development"})
    for name in ("kind-old", "kind-chosen"):
        with start_run(load_config("tiny-random", [f"tracking.experiment={name}"]), "unit-test"):
            pass
    assert client.get_experiment(old).tags[EXPERIMENT_KIND_TAG] == "custom_model_development"
    assert client.get_experiment(chosen).tags[EXPERIMENT_KIND_TAG] == "genai_development"


def _inputs(run) -> dict[str, tuple]:
    """context -> (name, digest, profile) of a run's dataset inputs."""
    import json

    out = {}
    for di in run.inputs.dataset_inputs:
        ctx = {t.key: t.value for t in di.tags}["mlflow.data.context"]
        out[ctx] = (di.dataset.name, di.dataset.digest, json.loads(di.dataset.profile) if di.dataset.profile else None)
    return out


def test_regeneration_and_training_runs_have_the_corpus_as_dataset_input(store, tmp_path):
    from lilicorr.platform.train.driver import _mlflow_run
    from lilicorr.platform.tracking import SOURCE_NAME_TAG, fingerprint_hash

    data = tmp_path / "corpus-a"
    cfg = load_config("tiny-random", [f"data.output_dir={data}", "head.kind=none", "tracking.experiment=datasets"])
    manifest = '{"fingerprint": {"limit": 8}, "shards": {"0": {"train": 7, "heldout": 1}, "1": {"train": 3}}}'
    with start_run(cfg, "regenerate") as regen:  # the corpus appears during the run: logged at its end
        data.mkdir()
        (data / "manifest.json").write_text(manifest)
    with _mlflow_run(cfg, None, True) as (train_id, uri):
        pass
    client = mlflow.MlflowClient(uri)
    digest = fingerprint_hash({"limit": 8})
    profile = {"train_rows": 10, "heldout_rows": 1}
    assert _inputs(client.get_run(regen.info.run_id)) == {"regenerated": ("corpus-a", digest, profile)}
    train = client.get_run(train_id)
    assert _inputs(train) == {"training": ("corpus-a", digest, profile)}
    assert train.data.tags[SOURCE_NAME_TAG] == "jobs/train.py"  # the Source column names the job
    assert client.get_run(regen.info.run_id).data.tags[SOURCE_NAME_TAG] == "jobs/regenerate.py"


def test_evaluation_run_has_its_prompts_and_the_exports_corpus_as_inputs(store, tmp_path):
    import json

    from lilicorr.platform.evaluate.run import log_eval_inputs
    from lilicorr.platform.tracking import fingerprint_hash
    from lilicorr.platform.tracking_inputs import benchmark_dataset

    data = tmp_path / "corpus-b"
    data.mkdir()
    (data / "manifest.json").write_text('{"fingerprint": {"limit": 3}, "shards": {}}')
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text(json.dumps({"config": {"data": {"output_dir": str(data)}}}))
    with start_run(load_config("tiny-random", ["tracking.experiment=datasets"]), "evaluate") as run:
        n = log_eval_inputs(mlflow.MlflowClient(), run.info.run_id,
                            {"mt-bench": benchmark_dataset("mt-bench", [{"prompt": "hi"}])},
                            {"ar": None, "dflash": str(export)})
    assert n == 2
    got = _inputs(mlflow.MlflowClient().get_run(run.info.run_id))
    assert got["drafter-training"][:2] == ("corpus-b", fingerprint_hash({"limit": 3}))
    assert got["evaluation"][0] == "mt-bench" and len(got["evaluation"][1]) == 16


def test_printed_links_open_the_model_training_side_of_the_ui():
    from lilicorr.platform.tracking import ui_link

    # MLflow 3.17's UI ignores mlflow.experimentKind behind its GenAI / Model training switch: a link
    # without workflowType opens a first visit on the GenAI trace overview (seen in headless Chromium).
    assert ui_link("7") == "http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning"
    assert ui_link("7", "abc").endswith("/#/experiments/7/runs/abc?workflowType=machine_learning")


def test_an_evaluation_cell_has_its_benchmark_as_dataset_input(store):
    from lilicorr.platform.evaluate.plan import Cell, Plan
    from lilicorr.platform.evaluate.run import _log_cell
    from lilicorr.platform.tracking import SOURCE_NAME_TAG
    from lilicorr.platform.tracking_inputs import benchmark_dataset

    cfg = load_config("tiny-random", ["tracking.experiment=cells"])
    with start_run(cfg, "evaluate") as parent:
        pass
    client = mlflow.MlflowClient()
    rid = _log_cell(client, parent.info.experiment_id, parent.info.run_id, Cell("ar", "mt-bench", 0.0, 0, 1),
                    {"metrics": {"tokens_per_s": 1.0}}, Plan(), 1, cfg, benchmark_dataset("mt-bench", [{"p": 1}]))
    run = client.get_run(rid)
    assert [(k, v[0]) for k, v in _inputs(run).items()] == [("evaluation", "mt-bench")]
    assert run.data.tags[SOURCE_NAME_TAG] == "jobs/evaluate.py"
