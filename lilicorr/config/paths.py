"""Where the repository is: REPO_ROOT, the folder this package runs from (the packaged corpora, the shipped
checkpoints). Pure Python."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
