"""Where things live in the repository and on the build host."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
VENVS_DIR = REPO_ROOT / ".venvs"
BUILD_ROOT = REPO_ROOT / "build"


def user_cache_dir() -> Path:
    """Per-user cache for things the tooling prepares once (test kernels, ...)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "meta-gpu-k8s"
