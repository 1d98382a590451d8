"""Every infra/kuberay-*.yaml validates against the ray.io/v1 schema, and the manifests fit together.

The schema is KubeRay's own (RayJob, RayService, RayCluster CRDs, ray.io/v1), vendored in
infra/schema/ray.io-v1.json without descriptions and with repeated subtrees shared (see
infra/schema/vendor_kuberay_crds.py). Validation is strict like `kubectl apply --validate=strict`: an object
schema that lists its properties rejects any other key, so a misspelt field fails here instead of being
silently pruned by the API server. No cluster runs here; the cross-file checks stand in for one.
"""

import copy
import json
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml

from lilicorr.config import load_config

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
MANIFESTS = sorted(INFRA.glob("kuberay-*.yaml"))
VENDORED = json.loads((INFRA / "schema" / "ray.io-v1.json").read_text())
CORE_KINDS = {("v1", "Namespace"), ("v1", "PersistentVolumeClaim"), ("v1", "Service"), ("v1", "ConfigMap"),
              ("apps/v1", "Deployment"), ("apps/v1", "StatefulSet")}


def _strict(node):
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if "properties" in node and "additionalProperties" not in node \
                and not node.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(x) for x in node]
    return node


STRICT_DEFS = _strict(VENDORED["$defs"])
VALIDATORS = {kind: jsonschema.Draft202012Validator({**_strict(schema), "$defs": STRICT_DEFS})
              for kind, schema in VENDORED["kinds"].items()}


def schema_errors(doc: dict) -> list[str]:
    validator = VALIDATORS.get(doc.get("kind"))
    if doc.get("apiVersion") != "ray.io/v1" or validator is None:
        return [f"not a ray.io/v1 kind the schema knows: {doc.get('apiVersion')} {doc.get('kind')}"]
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(doc)]


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


ALL = {p.name: _docs(p) for p in MANIFESTS}
COMMON = ALL["kuberay-common.yaml"]
RAY_DOCS = [(name, d) for name, docs in ALL.items() for d in docs if d["apiVersion"].startswith("ray.io/")]
RAY_JOBS = [(name, d) for name, d in RAY_DOCS if d["kind"] == "RayJob"]


def _cluster_spec(doc: dict) -> dict:
    return doc["spec"]["rayClusterSpec"] if doc["kind"] == "RayJob" else doc["spec"]["rayClusterConfig"]


def _pod_specs(doc: dict) -> list[dict]:
    """The pod specs of a Ray object (head and worker groups) or of a Deployment / StatefulSet."""
    if doc["apiVersion"].startswith("ray.io/"):
        cluster = _cluster_spec(doc)
        return [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"]
                                                                 for g in cluster.get("workerGroupSpecs", [])]
    if doc["kind"] in ("Deployment", "StatefulSet"):
        return [doc["spec"]["template"]["spec"]]
    return []


def _entrypoint(doc: dict) -> tuple[str, str, list[str]]:
    """(job script, preset, overrides) of a RayJob entrypoint `python /home/ray/lilicorr/jobs/X.py ...`."""
    words = shlex.split(doc["spec"]["entrypoint"])
    assert words[0] == "python", words
    script, rest, preset, overrides = words[1], words[2:], "smollm2-135m", []
    i = 0
    while i < len(rest):
        if rest[i] == "--preset":
            preset, i = rest[i + 1], i + 2
        elif rest[i] == "--head":
            overrides.append(f"head.kind={rest[i + 1]}")
            i += 2
        else:
            assert not rest[i].startswith("--"), f"flag {rest[i]} not understood by this test"
            overrides.append(rest[i])
            i += 1
    return script, preset, overrides


def test_every_manifest_file_is_picked_up():
    assert {"kuberay-common.yaml", "kuberay-regenerate-job.yaml", "kuberay-train-job.yaml"} <= set(ALL)
    assert VENDORED["$comment"].startswith("ray.io/v1 schemas from github.com/ray-project/kuberay@")
    assert set(VENDORED["kinds"]) == {"RayJob", "RayService", "RayCluster"}


@pytest.mark.parametrize("name, doc", RAY_DOCS, ids=[f"{n}:{d['metadata']['name']}" for n, d in RAY_DOCS])
def test_ray_objects_validate_against_the_crd_schema(name, doc):
    assert schema_errors(doc) == []


def _mutate(doc: dict, how: str) -> dict:
    doc = copy.deepcopy(doc)
    group = _cluster_spec(doc)["workerGroupSpecs"][0]
    container = group["template"]["spec"]["containers"][0]
    if how == "misspelt group key":
        group["rayStartParam"] = group.pop("rayStartParams")
    elif how == "string replicas":
        group["replicas"] = "1"
    elif how == "container without name":
        del container["name"]
    elif how == "misspelt container key":
        container["volumeMount"] = container.pop("volumeMounts")
    elif how == "string for a boolean":
        doc["spec"]["shutdownAfterJobFinishes"] = "yes"
    elif how == "no head group":
        del _cluster_spec(doc)["headGroupSpec"]
    return doc


@pytest.mark.parametrize("how, where", [
    ("misspelt group key", "rayStartParam"), ("string replicas", "replicas"), ("container without name", "name"),
    ("misspelt container key", "volumeMount"), ("string for a boolean", "shutdownAfterJobFinishes"),
    ("no head group", "headGroupSpec"),
])
def test_the_schema_check_catches_mistakes(how, where):
    _, job = next((n, d) for n, d in RAY_JOBS if n == "kuberay-train-job.yaml")
    errors = schema_errors(_mutate(job, how))
    assert any(where in e for e in errors), errors


def test_core_objects_are_well_formed_and_their_selectors_match():
    for name, docs in ALL.items():
        for d in docs:
            if d["apiVersion"].startswith("ray.io/"):
                continue
            assert (d["apiVersion"], d["kind"]) in CORE_KINDS, (name, d["apiVersion"], d["kind"])
            assert d["metadata"]["name"] and d["metadata"].get("namespace", "lilicorr") == "lilicorr"
            if d["kind"] in ("Deployment", "StatefulSet"):
                labels = d["spec"]["template"]["metadata"]["labels"]
                assert d["spec"]["selector"]["matchLabels"].items() <= labels.items(), d["metadata"]["name"]
    pods = [d["spec"]["template"]["metadata"]["labels"] for d in COMMON if d["kind"] == "Deployment"]
    for svc in (d for d in COMMON if d["kind"] == "Service"):
        assert any(svc["spec"]["selector"].items() <= labels.items() for labels in pods), svc["metadata"]["name"]
    assert all(d["metadata"].get("namespace", "lilicorr") == "lilicorr" for _, d in RAY_DOCS)  # or kubectl -n


def test_every_claim_the_pods_mount_is_declared_in_common():
    claims = {d["metadata"]["name"] for d in COMMON if d["kind"] == "PersistentVolumeClaim"}
    used = set()
    for name, docs in ALL.items():
        for d in docs:
            for pod in _pod_specs(d):
                volumes = {v["name"]: v for v in pod.get("volumes", [])}
                for c in pod["containers"]:
                    for m in c.get("volumeMounts", []):
                        assert m["name"] in volumes, f"{name}: mount {m['name']} has no volume"
                for v in volumes.values():
                    if "persistentVolumeClaim" in v:
                        used.add(v["persistentVolumeClaim"]["claimName"])
    assert used and used <= claims, used - claims
    assert {"lilicorr-hf-cache", "lilicorr-shared"} <= used


def test_jobs_track_to_the_mlflow_service_in_common():
    svc = next(d for d in COMMON if d["kind"] == "Service" and d["metadata"]["name"] == "mlflow")
    host = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local:{svc['spec']['ports'][0]['port']}"
    server = next(d for d in COMMON if d["kind"] == "Deployment" and d["metadata"]["name"] == "mlflow")
    args = server["spec"]["template"]["spec"]["containers"][0]["args"]
    allowed = next(a for a in args if a.startswith("--allowed-hosts=")).split("=", 1)[1].split(",")
    assert host in allowed
    assert any(a.startswith("--backend-store-uri=postgresql") for a in args) and "--serve-artifacts" in args
    for name, job in RAY_JOBS:
        for pod in _pod_specs(job):
            env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
            assert env["MLFLOW_TRACKING_URI"] == f"http://{host}", name


def _dockerfile_workdir_and_pins() -> tuple[str, str]:
    text = (ROOT / "Dockerfile").read_text()
    workdir = re.search(r"^WORKDIR (\S+)", text, re.M).group(1)
    ray_pin = re.search(r'"ray\[[^\]]*\]==([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    return workdir, ray_pin


@pytest.mark.parametrize("name, job", RAY_JOBS, ids=[n for n, _ in RAY_JOBS])
def test_rayjob_runs_a_job_of_the_image_with_a_valid_config_and_absolute_outputs(name, job):
    workdir, ray_pin = _dockerfile_workdir_and_pins()
    script, preset, overrides = _entrypoint(job)
    assert script.startswith(workdir + "/jobs/") and (ROOT / script[len(workdir) + 1:]).is_file(), script
    cfg = load_config(preset, overrides)  # raises ConfigError naming any bad key or value
    for key in ("data.output_dir", "train.output_dir"):
        value = next((o.split("=", 1)[1] for o in overrides if o.startswith(key + "=")), None)
        if value is not None:
            assert value.startswith(("/shared/", "s3://", "gs://")), f"{key}={value}: not on shared storage"
    assert _cluster_spec(job)["rayVersion"] == ray_pin
    images = {c["image"] for pod in _pod_specs(job) for c in pod["containers"]}
    assert images == {"REGISTRY/lilicorr:COMMIT"}
    assert cfg.preset == preset


@pytest.mark.parametrize("name, job", RAY_JOBS, ids=[n for n, _ in RAY_JOBS])
def test_ray_pods_have_dev_shm_in_memory(name, job):
    for pod in _pod_specs(job):
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for c in pod["containers"] for m in c["volumeMounts"]}
        assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
        assert "/shared" in mounts


def test_training_is_one_worker_pod_per_gpu_node_with_all_its_gpus():
    job = next(d for n, d in RAY_JOBS if _entrypoint(d)[0].endswith("/jobs/train.py"))
    script, preset, overrides = _entrypoint(job)
    cfg = load_config(preset, overrides)
    groups = _cluster_spec(job)["workerGroupSpecs"]
    gpus = 0
    for g in groups:
        limits = g["template"]["spec"]["containers"][0]["resources"]["limits"]
        per_pod = int(limits["nvidia.com/gpu"])
        assert per_pod == 8, "a GPU node's GPUs in one pod"
        assert g["replicas"] == g["minReplicas"] == g["maxReplicas"]
        gpus += per_pod * g["replicas"]
    assert cfg.train.use_gpu and cfg.train.num_workers == gpus
    head = _cluster_spec(job)["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"


def test_rayservice_autoscales_replicas_and_the_gpu_pods_that_hold_them():
    from lilicorr.serve_apps.deployment import app_builder

    (name, svc), = [(n, d) for n, d in RAY_DOCS if d["kind"] == "RayService"]
    (app,) = yaml.safe_load(svc["spec"]["serveConfigV2"])["applications"]
    auto = app["args"]["autoscaling_config"]
    assert "num_replicas" not in app["args"]  # Serve refuses a fixed count beside autoscaling
    assert 1 <= auto["min_replicas"] <= auto["initial_replicas"] <= auto["max_replicas"]
    cfg = load_config(app["args"]["preset"], app["args"]["overrides"])
    assert 0 < auto["target_ongoing_requests"] <= cfg.engine.max_batch_size  # scale before requests queue
    cluster = _cluster_spec(svc)
    assert cluster["enableInTreeAutoscaling"] is True
    (gpu,) = cluster["workerGroupSpecs"]
    per_pod = int(gpu["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
    replicas_per_pod = per_pod // int(app["args"]["num_gpus"])
    assert gpu["minReplicas"] * replicas_per_pod == auto["min_replicas"]
    assert gpu["maxReplicas"] * replicas_per_pod == auto["max_replicas"]
    assert gpu["replicas"] * replicas_per_pod == auto["initial_replicas"]
    dep = app_builder(app["args"])._bound_deployment
    assert dep._deployment_config.autoscaling_config.max_replicas == auto["max_replicas"]
    assert dep.init_args[0]["num_gpus"] == 1.0  # the replica loads its models on the GPU it reserves
