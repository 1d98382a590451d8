"""Rebuild infra/schema/ray.io-v1.json from KubeRay's CRDs (used by tests/infra/test_infra_kuberay.py).

    git clone https://github.com/ray-project/kuberay && \\
        python infra/schema/vendor_kuberay_crds.py kuberay/ray-operator/config/crd/bases [COMMIT]

The CRDs are ~3 MB of YAML (each embeds the whole Kubernetes PodTemplateSpec several times). What is kept:
the `ray.io/v1` openAPIV3Schema of RayJob, RayService and RayCluster, without `description` texts and
`status` (the cluster writes it), with every repeated subtree over 2 KB (the pod template, the container)
stored once under `$defs` and referenced by `$ref`. Nothing else changes: types, enums, required keys and
`x-kubernetes-*` markers are the CRD's own.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import yaml

KINDS = {"RayJob": "ray.io_rayjobs.yaml", "RayService": "ray.io_rayservices.yaml", "RayCluster": "ray.io_rayclusters.yaml"}
MIN_SHARED = 2000  # characters of JSON


def _strip(node):
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_strip(x) for x in node]
    return node


def _key(node) -> str:
    return hashlib.sha1(json.dumps(node, sort_keys=True).encode()).hexdigest()[:12]


MAPS = ("properties", "patternProperties")  # name -> schema mappings (not schemas themselves)
SUBS = ("items", "additionalProperties", "not")  # schema-valued keywords
LISTS = ("allOf", "anyOf", "oneOf")  # lists of schemas


def _children(schema: dict):
    """(keyword, name-or-index-or-None, child schema) for the subschemas of an openAPIV3 schema node."""
    for kw in MAPS:
        for name, sub in schema.get(kw, {}).items():
            yield kw, name, sub
    for kw in SUBS:
        if isinstance(schema.get(kw), dict):
            yield kw, None, schema[kw]
    for kw in LISTS:
        for n, sub in enumerate(schema.get(kw, [])):
            yield kw, n, sub


def _count(schema: dict, counts: Counter) -> None:
    if len(json.dumps(schema)) > MIN_SHARED:
        counts[_key(schema)] += 1
    for _, _, sub in _children(schema):
        _count(sub, counts)


def _share(schema: dict, shared: set, defs: dict) -> dict:
    """The schema with every shared subschema stored once in `defs` and replaced by {"$ref"}."""
    k = _key(schema)
    if k in shared and k in defs:
        return {"$ref": f"#/$defs/{k}"}
    out = dict(schema)
    for kw, name, sub in _children(schema):
        new = _share(sub, shared, defs)
        if kw in MAPS:
            out[kw] = {**out[kw], name: new}
        elif kw in LISTS:
            out[kw] = [*out[kw][:name], new, *out[kw][name + 1:]]
        else:
            out[kw] = new
    if k in shared:
        defs[k] = out
        return {"$ref": f"#/$defs/{k}"}
    return out


def build(crd_dir: Path, source_commit: str | None = None) -> dict:
    kinds = {}
    for kind, fname in KINDS.items():
        crd = yaml.safe_load((crd_dir / fname).read_text())
        (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        schema = _strip(v1["schema"]["openAPIV3Schema"])
        schema["properties"].pop("status", None)
        kinds[kind] = schema
    counts: Counter = Counter()
    for schema in kinds.values():
        _count(schema, counts)
    shared = {k for k, n in counts.items() if n > 1}
    defs: dict = {}
    kinds = {kind: _share(s, shared, defs) for kind, s in kinds.items()}
    commit = source_commit or subprocess.run(["git", "-C", str(crd_dir), "rev-parse", "HEAD"], capture_output=True,
                                             text=True, check=True).stdout.strip()
    return {"$comment": f"ray.io/v1 schemas from github.com/ray-project/kuberay@{commit} "
                        f"ray-operator/config/crd/bases; rebuilt by infra/schema/vendor_kuberay_crds.py",
            "kinds": kinds, "$defs": defs}


if __name__ == "__main__":
    out = Path(__file__).with_name("ray.io-v1.json")
    out.write_text(json.dumps(build(Path(sys.argv[1]), *sys.argv[2:3]), sort_keys=True, separators=(",", ":")) + "\n")
    print(f"wrote {out} ({out.stat().st_size // 1024} KB)")
