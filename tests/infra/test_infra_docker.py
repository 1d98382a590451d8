"""The Dockerfile and the cluster launcher install what the jobs import, with pyproject.toml's pins.

No container engine runs on these machines, so the image is not built here: these tests read the Dockerfile
(and infra/cluster.yaml) and check every install step against pyproject.toml and requirements-assets.txt.
"""

import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pins() -> dict[str, str]:
    """{"torch": "==2.13.0", "ray": "==2.60.0", ...} from pyproject's dependencies (extras dropped)."""
    pins = {}
    for dep in _project()["dependencies"]:
        m = re.match(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*(.*)$", dep)
        pins[m.group(1).lower()] = m.group(3).replace(" ", "")
    return pins


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """(ARG defaults, [(instruction, argument)]) with line continuations joined and comments dropped."""
    lines, buf = [], ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("#"):
            continue
        buf += raw.rstrip()[:-1] + " " if raw.rstrip().endswith("\\") else raw
        if not raw.rstrip().endswith("\\"):
            if buf.strip():
                lines.append(buf.strip())
            buf = ""
    args, steps = {}, []
    for line in lines:
        instr, _, rest = line.partition(" ")
        if instr.upper() == "ARG":
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip()
        steps.append((instr.upper(), rest.strip()))
    return args, steps


def _expand(cmd: str, args: dict[str, str]) -> str:
    cmd = re.sub(r"\$\{(\w+):\+[^}]*\}", lambda m: "" if not args.get(m.group(1)) else m.group(0), cmd)
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), cmd)


def pip_installs(commands: list[str]) -> list[list[str]]:
    """The argument lists of every `pip install` in shell commands (split on && and ;)."""
    out = []
    for command in commands:
        for part in re.split(r"&&|;", command):
            words = shlex.split(part)
            if words[:2] == ["pip", "install"]:
                out.append(words[2:])
    return out


def install_problems(installs: list[list[str]], project_dir: str) -> list[str]:
    """What differs from `make install`: pyproject's pins (via `pip install -e <project>`), the assets list."""
    problems = []
    pins = _pins()
    reqs = [a for words in installs for i, a in enumerate(words) if not a.startswith("-") and a != project_dir
            and (i == 0 or words[i - 1] not in ("-r", "-c", "-e", "--index-url", "--extra-index-url"))]
    for req in reqs:
        m = re.match(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?(.*)$", req)
        name, spec = m.group(1).lower(), m.group(3)
        if name in pins and spec != pins[name]:
            problems.append(f"{name}{spec} installed, pyproject.toml pins {name}{pins[name]}")
    if not any(w[-2:] == ["-e", project_dir] or w[-1:] == [project_dir] for w in installs):
        problems.append(f"the project itself ({project_dir}) is never pip-installed, so its pins are not")
    assets = [w for w in installs if "-r" in w and w[w.index("-r") + 1].endswith("requirements-assets.txt")]
    if not assets or "--no-deps" not in assets[0]:
        problems.append("requirements-assets.txt is not installed with --no-deps")
    return problems


def _dockerfile(text: str | None = None) -> tuple[dict[str, str], list[tuple[str, str]]]:
    return parse_dockerfile(text if text is not None else (ROOT / "Dockerfile").read_text())


def dockerfile_problems(text: str | None = None) -> list[str]:
    args, steps = _dockerfile(text)
    runs = [_expand(rest, args) for instr, rest in steps if instr == "RUN"]
    problems = install_problems(pip_installs(runs), ".")
    copied = " ".join(rest for instr, rest in steps if instr == "COPY")
    for needed in ("pyproject.toml", "requirements-assets.txt", "lilicorr", "jobs"):
        if needed not in copied.split():
            problems.append(f"{needed} is not copied into the image")
    return problems


def test_dockerfile_installs_pyproject_pins_and_assets():
    assert dockerfile_problems() == []


@pytest.mark.parametrize("edit, problem", [
    (lambda s: s.replace("ARG TORCH_VERSION=2.13.0", "ARG TORCH_VERSION=2.12.0"), "torch==2.12.0 installed"),
    (lambda s: s.replace("pip install -e .", "pip install ray"), "never pip-installed"),
    (lambda s: s.replace("--no-deps -r requirements-assets.txt", "-r requirements-assets.txt"), "--no-deps"),
    (lambda s: s.replace("COPY --chown=ray:users jobs ./jobs", ""), "jobs is not copied"),
])
def test_the_pin_check_catches_a_drift(edit, problem):
    text = (ROOT / "Dockerfile").read_text()
    changed = edit(text)
    assert changed != text
    assert any(problem in p for p in dockerfile_problems(changed)), dockerfile_problems(changed)


def test_base_image_is_the_pinned_ray_on_a_supported_python():
    args, steps = _dockerfile()
    assert steps[[i for i, _ in steps].index("FROM")][1] == "${BASE_IMAGE}"
    m = re.fullmatch(r"rayproject/ray:([\d.]+)-py(\d)(\d+)-cu\d+", args["BASE_IMAGE"])
    assert m, args["BASE_IMAGE"]
    assert "==" + m.group(1) == _pins()["ray"]
    low = re.match(r">=(\d+)\.(\d+)", _project()["requires-python"]).groups()
    assert (int(m.group(2)), int(m.group(3))) >= tuple(map(int, low))


def test_dockerignore_keeps_the_build_context_small_but_complete():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", "outputs"} <= ignored
    assert not ignored & {"pyproject.toml", "requirements-assets.txt", "README.md", "lilicorr", "jobs", "infra"}


def test_cluster_launcher_installs_the_same_and_sets_the_tracking_uri():
    cluster = yaml.safe_load((ROOT / "infra" / "cluster.yaml").read_text())
    project_dir = next(remote for remote, local in cluster["file_mounts"].items() if local == ".")
    assert install_problems(pip_installs(cluster["setup_commands"]), project_dir) == []
    assert cluster["docker"]["image"] == _dockerfile()[0]["BASE_IMAGE"]
    server = next(c for c in cluster["head_start_ray_commands"] if "mlflow server" in c)
    assert "--host 0.0.0.0 --port 5000" in server and "/shared/" in server
    assert ".venv" in cluster["rsync_exclude"] and "outputs" in cluster["rsync_exclude"]


LOOPBACK = re.compile(r"(127\.\d+\.\d+\.\d+|localhost|\[?::1\]?|0\.0\.0\.0)(:|/|$)")


def _ray_start(commands: list[str]) -> str:
    (start,) = [c for c in commands if re.search(r"\bray start\b", c)]
    return start


def test_cluster_recipe_gives_every_node_a_tracking_uri_that_is_not_loopback():
    """Rank 0 logs from a GPU node: the URI each node's raylet (hence every Ray worker) carries must name
    the head's reachable address, and the server must listen on it."""
    cluster = yaml.safe_load((ROOT / "infra" / "cluster.yaml").read_text())
    assert "MLFLOW_TRACKING_URI" not in json.dumps(cluster["docker"])  # no fixed loopback URI in the containers
    worker = re.search(r"MLFLOW_TRACKING_URI=(\S+) ray start --address=\$RAY_HEAD_IP:6379",
                       _ray_start(cluster["worker_start_ray_commands"]))
    assert worker and worker.group(1) == "http://$RAY_HEAD_IP:5000" and not LOOPBACK.search(worker.group(1)[7:])
    head = _ray_start(cluster["head_start_ray_commands"])
    assert head.startswith("MLFLOW_TRACKING_URI=$(cat ~/mlflow_tracking_uri) ray start --head")
    (writer,) = [c for c in cluster["head_setup_commands"] if "> ~/mlflow_tracking_uri" in c]
    assert writer.startswith('echo "http://$(python -c \'import ray.util; print(ray.util.get_node_ip_address())\'):5000"')
    assert not LOOPBACK.search(writer.split("http://", 1)[1])
    assert LOOPBACK.search("http://127.0.0.1:5000"[7:]) and LOOPBACK.search("localhost:5000")  # the check bites
    server = next(c for c in cluster["head_start_ray_commands"] if "mlflow server" in c)
    assert '--allowed-hosts "$(cut -d/ -f3 ~/mlflow_tracking_uri),' in server  # MLflow accepts the head's address
