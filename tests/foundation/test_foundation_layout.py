"""Layout: one import package, nothing at the repo root that shadows stdlib or HF packages."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_repo_root_first_on_path_keeps_stdlib_platform():
    # `ray job submit --working-dir .` and `python -m pytest` put the repo root first on sys.path.
    where = _run("import sys; sys.path.insert(0, '.'); import platform; print(platform.__file__); platform.system()")
    assert not where.startswith(str(ROOT)), f"'platform' resolved to the repo: {where}"


def test_no_top_level_shadowing_packages():
    for name in ("platform", "models", "kernels", "engine"):
        assert not (ROOT / name / "__init__.py").exists(), f"top-level {name}/ would be importable"
        assert not (ROOT / f"{name}.py").exists()


def test_core_packages_import_without_ray_deepspeed_mlflow():
    loaded = json.loads(_run(
        "import sys, json; import lilicorr, lilicorr.config, lilicorr.models, lilicorr.engine, lilicorr.kernels; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'deepspeed', 'mlflow'))))"))
    assert loaded == []


def test_core_sources_never_import_ray_deepspeed_mlflow():
    import re

    pattern = re.compile(r"^\s*(import|from)\s+(ray|deepspeed|mlflow)\b", re.M)
    for sub in ("models", "engine", "kernels"):
        for path in (ROOT / "lilicorr" / sub).rglob("*.py"):
            assert not pattern.search(path.read_text()), f"{path} imports Ray/DeepSpeed/MLflow"


def test_core_sources_never_import_platform_or_serve_apps():
    # The import direction: jobs -> bench -> {platform, serve_apps} -> {engine, models} -> kernels.
    import re

    pattern = re.compile(r"lilicorr\.(platform|serve_apps)\b|from\s+lilicorr\s+import\s+(platform|serve_apps)\b")
    offenders = [str(path.relative_to(ROOT)) for sub in ("models", "engine", "kernels")
                 for path in (ROOT / "lilicorr" / sub).rglob("*.py") if pattern.search(path.read_text())]
    assert offenders == [], f"core modules naming lilicorr.platform / lilicorr.serve_apps: {offenders}"


def test_no_back_arrow_from_models_or_kernels():
    """models never import the engine, kernels neither models nor the engine: what both sides read (the shared
    RMSNorm / RoPE math, an HF config's RoPE settings) lives on the lower side."""
    import re

    engine = re.compile(r"lilicorr\.engine\b|from\s+lilicorr\s+import\s+engine\b|from\s+\.\.engine\b")
    models = re.compile(r"lilicorr\.models\b|from\s+lilicorr\s+import\s+models\b|from\s+\.\.models\b")
    offenders = [str(p.relative_to(ROOT)) for sub, rx in (("models", engine), ("kernels", engine), ("kernels", models))
                 for p in (ROOT / "lilicorr" / sub).rglob("*.py") if rx.search(p.read_text())]
    assert offenders == [], f"back-arrows in the import direction: {offenders}"


def test_no_package_module_over_400_lines():
    too_long = {str(p.relative_to(ROOT)): n for p in (ROOT / "lilicorr").rglob("*.py")
                if (n := len(p.read_text().splitlines())) > 400}
    assert too_long == {}, f"split these modules (over 400 lines): {too_long}"


_SERVE_APPS_IMPORT = r"lilicorr\.serve_apps\b|from\s+lilicorr\s+import\s+(\([^)]*)?\bserve_apps\b|from\s+\.\.+serve_apps\b"


def _importers(sub: str, pattern: str) -> list[str]:
    import re

    rx = re.compile(pattern)
    return [str(p.relative_to(ROOT)) for p in (ROOT / "lilicorr" / sub).rglob("*.py") if rx.search(p.read_text())]


def test_platform_never_imports_serve_apps():
    # jobs -> {platform, serve_apps}: the two are siblings and only serve_apps may lean on the platform
    # (assets, chat prompts); a platform module naming serve_apps turns the direction into a cycle.
    assert _importers("platform", _SERVE_APPS_IMPORT) == []


def test_serve_apps_import_pattern_catches_each_spelling(tmp_path):
    # The layout test above is only as good as its pattern: every way of writing the import must match.
    import re

    rx = re.compile(_SERVE_APPS_IMPORT)
    for line in ("from lilicorr.serve_apps.launch import start_serve", "import lilicorr.serve_apps.app",
                 "from lilicorr import serve_apps", "from lilicorr import (chat, serve_apps)",
                 "from ..serve_apps import launch", "importlib.import_module('lilicorr.serve_apps.launch')"):
        assert rx.search(line), line
    for line in ("from lilicorr.platform import assets", "from .serve import x", "serve_apps_count = 1"):
        assert not rx.search(line), line


def test_platform_modules_load_without_serve_apps():
    # Importing every platform module leaves lilicorr.serve_apps unloaded (a lazy import inside a
    # function would pass the source scan only if it is never reached; this catches module-level ones).
    loaded = json.loads(_run(
        "import sys, json, pkgutil, importlib, lilicorr.platform as p\n"
        "for m in pkgutil.walk_packages(p.__path__, 'lilicorr.platform.'):\n"
        "    importlib.import_module(m.name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('lilicorr.serve_apps'))))"))
    assert loaded == []


_BENCH_IMPORT = r"lilicorr\.bench\b|from\s+lilicorr\s+import\s+(\([^)]*)?\bbench\b|from\s+\.\.+bench\b"


def test_no_package_but_jobs_and_tests_imports_the_benchmarks():
    # lilicorr/bench sits at the jobs' level: it may import every package, and none of them may import it (a
    # measurement is never part of what it measures; the GPU image runs the engine without the benchmarks).
    offenders = {sub: found for sub in ("models", "engine", "kernels", "platform", "serve_apps", "config")
                 if (found := _importers(sub, _BENCH_IMPORT))}
    assert offenders == {}, f"modules naming lilicorr.bench: {offenders}"


def test_bench_import_pattern_catches_each_spelling():
    import re

    rx = re.compile(_BENCH_IMPORT)
    for line in ("from lilicorr.bench.harness import interleave", "import lilicorr.bench.stages",
                 "from lilicorr import bench", "from lilicorr import (engine, bench)", "from ..bench import stages",
                 "importlib.import_module('lilicorr.bench.gpu')"):
        assert rx.search(line), line
    for line in ("from lilicorr.platform.benchmark_prompts import benchmark_prompts", "from ..benchmark_prompts import x",
                 "bench_count = 1"):
        assert not rx.search(line), line


def test_tests_are_grouped_in_folders_by_area():
    tests = ROOT / "tests"
    assert not list(tests.glob("test_*.py")), "a test module directly under tests/: put it in its area's folder"
    areas = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    assert areas == {"bench", "engine", "evaluate", "foundation", "infra", "kernels", "models", "parity", "pipeline",
                     "regenerate", "serve", "sweep", "train"}
    for area in areas:
        assert list((tests / area).glob("test_*.py")), area
