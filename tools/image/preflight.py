"""Checks that save a person hours: before any build work, are the update-signing keys
there for an A/B image and is NVIDIA's driver licence accepted where the image carries the
driver; after kas failed, was it the network.

An A/B build without keys used to fail at do_rootfs, hours in (the layer's
gpu_k8s_check_artifact_signing); the same rule (meta-gpu-k8s/lib/gpu_k8s/signing.py) runs
here first, from the environment and the build's site.conf, which is where kas and bitbake
take the keys from."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import yaml

from tools.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "meta-gpu-k8s" / "lib"))
from gpu_k8s.signing import signing_problems

SIGNING_VARIABLES = ("MENDER_ARTIFACT_SIGNING_KEY", "MENDER_ARTIFACT_VERIFY_KEY", "GPU_K8S_ARTIFACT_SIGNING")
# The debug image signs when keys are given (classes/gpu_k8s_mender.bbclass).
OPTIONAL_SIGNING_IMAGES = ("gpu-k8s-image-dev",)
_ASSIGNMENT = re.compile(r'^\s*(?P<name>[A-Z_]+)\s*(\?\?=|\?=|=|:=)\s*"(?P<value>[^"]*)"')


def kas_paths(kas_argument: str, root: Path = REPO_ROOT) -> list[Path]:
    """The files of a kas command-line argument (a.yml:b.yml, relative to the repository)."""
    return [root / part for part in kas_argument.split(":") if part]


def kas_documents(kas_file: Path | Iterable[Path]) -> Iterable[dict]:
    """Kas files and every file they include (paths relative to the including file, as
    kas reads them; includes from other repositories are not followed)."""
    seen: set[Path] = set()
    pending = [kas_file] if isinstance(kas_file, Path) else list(kas_file)[::-1]
    while pending:
        path = pending.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        document = yaml.safe_load(path.read_text()) or {}
        yield document
        for entry in (document.get("header") or {}).get("includes") or []:
            if isinstance(entry, str):
                pending.append((path.parent / entry).resolve())
                pending.append((REPO_ROOT / entry).resolve())


def builds_ab_images(kas_file: Path | Iterable[Path]) -> bool:
    """Whether the configuration opts into A/B updates (INHERIT gpu_k8s_mender)."""
    for document in kas_documents(kas_file):
        for text in (document.get("local_conf_header") or {}).values():
            if re.search(r"^\s*INHERIT\s*\+?=.*\bgpu_k8s_mender\b", str(text), re.M):
                return True
    return False


def local_conf_texts(kas_files: Path | Iterable[Path], site_conf: Path) -> list[str]:
    """What bitbake will read as local configuration: every kas file's local_conf_header
    and the build's site.conf."""
    texts = [str(text) for document in kas_documents(kas_files)
             for text in (document.get("local_conf_header") or {}).values()]
    if site_conf.is_file():
        texts.append(site_conf.read_text(encoding="utf-8", errors="replace"))
    return texts


NVIDIA_LICENCE_FLAG = "nvidia-driver"  # the nvidia-driver recipe's LICENSE_FLAGS
_ACCEPTS_NVIDIA = re.compile(r"^\s*LICENSE_FLAGS_ACCEPTED\b[^=\n]*=.*\bnvidia-driver\b", re.M)
_NVIDIA_OFF = re.compile(r'^\s*GPU_K8S_NVIDIA\s*(\?\?=|\?=|=|:=)\s*"0"', re.M)


def nvidia_licence_problem(kas_files: Path | Iterable[Path], carries_nvidia: bool, site_conf: Path) -> str:
    """One line naming the fix when the image carries NVIDIA's driver and nothing accepts its
    licence (bitbake would stop at parse time, after kas fetched every layer); '' otherwise.
    The layer's own check (classes/gpu_k8s_nvidia.bbclass) stays the authority."""
    if not carries_nvidia:
        return ""
    texts = local_conf_texts(kas_files, site_conf)
    if any(_ACCEPTS_NVIDIA.search(text) or _NVIDIA_OFF.search(text) for text in texts):
        return ""
    return ("the image carries NVIDIA's driver, whose licence is not accepted (bitbake stops at parse time): read "
            "it (https://www.nvidia.com/en-us/drivers/nvidia-license/; docs/layer.md, \"NVIDIA on x86-64\") and "
            f"pass --accept-nvidia-licence, or set LICENSE_FLAGS_ACCEPTED += \"{NVIDIA_LICENCE_FLAG}\" in {site_conf}")


def site_settings(site_conf: Path) -> dict[str, str]:
    try:
        lines = site_conf.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        match = _ASSIGNMENT.match(line)
        if match and match["name"] in SIGNING_VARIABLES:
            found[match["name"]] = match["value"]
    return found


def signing_problem(kas_file: Path | Iterable[Path], image: str, environ: Mapping[str, str], site_conf: Path) -> str:
    """One line saying what to set, or '' when the build's artifacts can be signed as required."""
    if not builds_ab_images(kas_file):
        return ""
    values = {**site_settings(site_conf), **{name: environ[name] for name in SIGNING_VARIABLES if environ.get(name)}}
    default = "optional" if image in OPTIONAL_SIGNING_IMAGES else "required"
    problems = signing_problems(values.get("GPU_K8S_ARTIFACT_SIGNING", default),
                                values.get("MENDER_ARTIFACT_SIGNING_KEY"), values.get("MENDER_ARTIFACT_VERIFY_KEY"))
    return "; ".join(problems)


# What git/kas print when there is no network (or no route to the repositories' hosts).
_OFFLINE_SIGNS = ("fetch repos failed", "could not resolve host", "temporary failure in name resolution",
                  "network is unreachable", "failed to connect to", "connection timed out", "unable to access",
                  "name or service not known")


def offline_hint(output: Iterable[str], option: str = " (--repo-ref-dir)") -> str:
    """When kas failed fetching the layers for lack of network: what to do about it (option:
    how the task takes KAS_REPO_REF_DIR besides the environment)."""
    text = "\n".join(output).lower()
    if not any(sign in text for sign in _OFFLINE_SIGNS):
        return ""
    return ("kas could not fetch the layers' git repositories: check the network (and a proxy), or build "
            f"from local copies: KAS_REPO_REF_DIR=DIR{option} with clones of the repositories, "
            "KAS_PREMIRRORS for other git URLs, DL_DIR / SSTATE_MIRRORS for sources and sstate "
            "(docs/tooling.md)")
