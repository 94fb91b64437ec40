"""Is this host fit for a Yocto build? Each check returns problems that name the fix.

The checks take their facts as arguments (free bytes, euid, which(), locale list) so the
decisions are testable; `gather_host_facts` is the only part that looks at the host."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3

# A full image build (toolchain, kernel, k3s, docker, sstate) needs about this much; the
# Yocto project quotes 90+ GB. Lower it with --min-free-gb when DL_DIR/SSTATE_DIR are
# shared caches that already hold most of the work.
DEFAULT_MIN_FREE_GB = 100

# Commands bitbake/kas call on the host, with the Debian/Ubuntu package providing each
# (the Yocto "required packages" list for Debian, minus what every system has).
REQUIRED_HOST_TOOLS: dict[str, str] = {
    "git": "git",
    "gcc": "gcc",
    "g++": "g++",
    "make": "make",
    "chrpath": "chrpath",
    "diffstat": "diffstat",
    "gawk": "gawk",
    "wget": "wget",
    "cpio": "cpio",
    "unzip": "unzip",
    "makeinfo": "texinfo",
    "socat": "socat",
    "xz": "xz-utils",
    "zstd": "zstd",
    "lz4c": "lz4",
    "file": "file",
    "patch": "patch",
    "bzip2": "bzip2",
    "perl": "perl",
    "python3": "python3",
    "diff": "diffutils",
}

REQUIRED_LOCALE = "en_US.UTF-8"


@dataclass(frozen=True)
class Problem:
    """Why the host cannot build, and what to do about it."""

    reason: str
    fix: str

    def __str__(self) -> str:
        return f"{self.reason}\n      fix: {self.fix}"


def check_free_disk(path: Path, free_bytes: int, min_free_gb: int) -> list[Problem]:
    if free_bytes >= min_free_gb * GIB:
        return []
    return [
        Problem(
            f"only {free_bytes / GIB:.0f} GB free under {path}; a full image build needs "
            f"about {min_free_gb} GB",
            "free space there, point --build-dir (or DL_DIR/SSTATE_DIR) at a larger disk, "
            "or pass --min-free-gb N if your caches already hold most of the build",
        )
    ]


def check_host_tools(which: Callable[[str], str | None]) -> list[Problem]:
    missing = [tool for tool in REQUIRED_HOST_TOOLS if which(tool) is None]
    if not missing:
        return []
    packages = sorted({REQUIRED_HOST_TOOLS[tool] for tool in missing})
    return [
        Problem(
            f"host tools that bitbake needs are missing: {', '.join(missing)}",
            f"sudo apt-get install {' '.join(packages)}   "
            "(other distributions: see the Yocto 'Required Packages for the Build Host')",
        )
    ]


def own_clone_steps(repo_root: Path, origin_url: str | None, bundle: Path = Path("/tmp/meta-gpu-k8s.bundle"),
                    next_step: str = "./task build") -> str:
    """How a root user gives a normal user a clone of their own. `su builder` inside root's
    clone cannot work: /root is mode 0700, and kas and git refuse a checkout another user
    owns. A network origin can be cloned again; a local one (a path, file://) is owned by
    root too, and git refuses it as "dubious ownership" (or cannot read it). Then a bundle,
    a plain file, carries every branch past git's ownership checks."""
    if origin_url and not is_local_origin(origin_url):
        source, prepare = origin_url, ""
    else:
        source = str(bundle)
        prepare = f"git -C {repo_root} bundle create {source} --all && chmod 644 {source} && "
    return (
        f"{prepare}adduser builder && su - builder -c 'git clone {source} meta-gpu-k8s', "
        f"then as builder: cd meta-gpu-k8s && {next_step} (docs/tooling.md, 'Building as root')"
    )


def is_local_origin(url: str) -> bool:
    """A path or file:// URL, not host:path or a scheme://host URL."""
    if url.startswith("file://") or url.startswith(("/", "./", "../", "~")):
        return True
    return "://" not in url and ":" not in url


def origin_url(repo_root: Path) -> str | None:
    try:
        completed = subprocess.run(["git", "-C", str(repo_root), "remote", "get-url", "origin"],
                                   capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return None
    return completed.stdout.strip() or None if completed.returncode == 0 else None


def check_not_root(euid: int, repo_root: Path | None = None, next_step: str = "./task build") -> list[Problem]:
    """bitbake refuses root for a build and for the parse check-image runs alike; next_step
    is the task to run again as the other user."""
    if euid != 0:
        return []
    if repo_root is None:
        from tools.paths import REPO_ROOT

        repo_root = REPO_ROOT
    steps = own_clone_steps(repo_root, origin_url(repo_root), next_step=next_step)
    reason = ("running as root: bitbake refuses to build as root" if next_step.startswith("./task build") else
              "running as root: check-image parses the recipes with bitbake, which refuses to run as root")
    return [Problem(reason, f"as root: {steps}")]


def _normalise_locale(name: str) -> str:
    return name.lower().replace("utf-8", "utf8")


def check_locale(available_locales: Iterable[str]) -> list[Problem]:
    wanted = _normalise_locale(REQUIRED_LOCALE)
    if any(_normalise_locale(name) == wanted for name in available_locales):
        return []
    return [
        Problem(
            f"the {REQUIRED_LOCALE} locale is not installed (bitbake runs with it)",
            "sudo apt-get install locales && "
            "sudo sed -i 's/^# *en_US.UTF-8/en_US.UTF-8/' /etc/locale.gen && sudo locale-gen",
        )
    ]


@dataclass(frozen=True)
class HostFacts:
    build_dir: Path
    free_bytes: int
    euid: int
    locales: tuple[str, ...]


def nearest_existing(path: Path) -> Path:
    """The path itself or its closest existing parent (the build dir may not exist yet)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def list_locales() -> tuple[str, ...]:
    try:
        output = subprocess.run(["locale", "-a"], capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:
        return ()
    return tuple(line.strip() for line in output.splitlines() if line.strip())


def gather_host_facts(build_dir: Path) -> HostFacts:
    existing = nearest_existing(build_dir)
    return HostFacts(
        build_dir=build_dir,
        free_bytes=shutil.disk_usage(existing).free,
        euid=os.geteuid(),
        locales=list_locales(),
    )


def check_build_host(
    facts: HostFacts, min_free_gb: int, which: Callable[[str], str | None] = shutil.which,
    next_step: str = "./task build",
) -> list[Problem]:
    """Every reason this host cannot run a Yocto build, empty when it can."""
    return [
        *check_not_root(facts.euid, next_step=next_step),
        *check_free_disk(facts.build_dir, facts.free_bytes, min_free_gb),
        *check_host_tools(which),
        *check_locale(facts.locales),
    ]
