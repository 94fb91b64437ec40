"""The release version's one rule, for `./task build` (GPU_K8S_VERSION) and `./task rollout`.

The version is every image's Mender artifact name and a rollout's Plan version, which
system-upgrade-controller turns into a Kubernetes label value (upgrade.cattle.io/version on
each job) after replacing '+' with '-' (pkg/upgrade/plan/plan.go): so it must be one, '+' aside."""

from __future__ import annotations

import re

_VERSION = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._+-]{0,61}[A-Za-z0-9])?$")
RULE = ("1-63 letters, digits, '.', '_', '+' or '-', starting and ending with a letter or digit (it becomes a "
        "Kubernetes label value), e.g. 1.4.0")


def version_problem(version: str) -> str:
    """'' for a valid release version; else the rule it breaks, with an example."""
    return "" if _VERSION.match(version) else f"{version!r} must be {RULE}"
