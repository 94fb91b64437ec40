"""Where things live in the repository and on the build host."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
VENVS_DIR = REPO_ROOT / ".venvs"
# Every machine's kas work dir, the shared downloads and sstate, and releases live under it;
# GPU_K8S_BUILD_ROOT moves all of them at once (a larger disk; the tests' temporary trees).
BUILD_ROOT = Path(os.environ.get("GPU_K8S_BUILD_ROOT") or REPO_ROOT / "build").expanduser().absolute()


def user_cache_dir() -> Path:
    """Per-user cache for things the tooling prepares once (test kernels, ...)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "meta-gpu-k8s"
