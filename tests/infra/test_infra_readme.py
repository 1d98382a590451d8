"""The README's Ray recipe is written so it works: checked line by line (it was also run once for real on
tiny-random; a test that starts a Ray head and submits jobs takes minutes here, so this one reads it).
"""

import shlex
from pathlib import Path

from lilicorr.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def _recipe() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### On a Ray cluster"):]
    block = section[section.index("```bash\n") + 8:]
    block = block[:block.index("```")]
    return [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]


def _job(command: str) -> tuple[str, str, list[str]]:
    """(job, preset, overrides) of `ray job submit ... -- python jobs/X.py ...` ($PWD kept as the text)."""
    words = shlex.split(command.split("#")[0].replace("$PWD", "/PWD"))
    args = words[words.index("--") + 1:]
    assert args[0] == "python" and args[1].startswith("jobs/"), args
    assert (ROOT / args[1]).is_file()
    preset, overrides, rest = "smollm2-135m", [], args[2:]
    while rest:
        if rest[0] == "--preset":
            preset, rest = rest[1], rest[2:]
        elif rest[0] == "--head":
            overrides.append(f"head.kind={rest[1]}")
            rest = rest[2:]
        else:
            overrides.append(rest.pop(0))
    return args[1], preset, overrides


def test_ray_recipe_starts_from_the_venv_with_token_auth_and_absolute_outputs():
    lines = _recipe()
    start = next(i for i, c in enumerate(lines) if c.startswith("ray start --head"))
    assert any(c.startswith(". .venv/bin/activate") for c in lines[:start]), "ray must start from .venv"
    assert "--node-ip-address=127.0.0.1" in lines[start]
    assert any("RAY_AUTH_MODE=token" in c and "RAY_ADDRESS=http://127.0.0.1:8265" in c for c in lines[start:])
    env = next(c for c in lines if c.startswith("ENV="))
    assert "MLFLOW_TRACKING_URI\": \"sqlite:///'$PWD'/" in env and "LILICORR_LOG_DIR\": \"'$PWD'/" in env
    submits = [c for c in lines if c.startswith("ray job submit")]
    jobs = [_job(c) for c in submits]
    assert [j for j, _, _ in jobs] == ["jobs/regenerate.py", "jobs/train.py"], "regenerate before train"
    corpus = set()
    for command, (job, preset, overrides) in zip(submits, jobs):
        assert "--working-dir ." in command and '--runtime-env-json "$ENV"' in command
        load_config(preset, overrides)  # every override is a real, well-typed key
        for o in overrides:
            key, _, value = o.partition("=")
            if key.endswith("output_dir"):
                assert value.startswith("/PWD/"), f"{job}: {o} is relative (it would land in the job's temp copy)"
            if key == "data.output_dir":
                corpus.add(value)
    assert len(corpus) == 1, "train reads the corpus regenerate wrote"
    assert lines[-1] == "ray stop"
