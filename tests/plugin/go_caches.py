"""Where the tests' Go builds keep their caches: the conformance leg's (build/go; GPU_K8S_BUILD_ROOT
moves it, as tools.paths does), which `./task test` fills before the plugin legs run. Never the
user's own ~/go or ~/.cache: what a test finds there would decide whether it runs."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_ROOT = Path(os.environ.get("GPU_K8S_BUILD_ROOT") or REPO / "build").expanduser().absolute()
GO_ROOT = BUILD_ROOT / "go"
MODULE_CACHE = GO_ROOT / "mod"
CONFORMANCE = REPO / "conformance"  # the Go module pinning Kubernetes at our k3s's version


def go_env(**extra: str) -> dict[str, str]:
    """The environment for `go` with those caches (written deletable), no toolchain switch."""
    return {**os.environ, "GOMODCACHE": str(MODULE_CACHE), "GOCACHE": str(GO_ROOT / "cache"),
            "GOFLAGS": "-modcacherw", "GOTOOLCHAIN": "local", **extra}
