"""`build --container`: the same kas build inside kas's own build container (kas-container),
for a host without Yocto's host packages.

kas-container (installed with kas, the version requirements/tools.txt pins) runs kas in
ghcr.io/siemens/kas/kas:<that version> with docker or podman. It carries into the container
only what its own rules name: the repository (read-only), the kas work dir, build dir, DL_DIR,
SSTATE_DIR and KAS_REPO_REF_DIR as mounts, and a fixed list of variables. Everything else the
build needs from this host (the release version, the update-signing keys) goes in here, through
its --runtime-args option. The decisions are pure functions of gathered facts
(`gather_engine_facts`, `gather_network_facts` are the only parts that look at the host)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from tools import process
from tools.image import hostcheck, preflight
from tools.paths import REPO_ROOT

ENGINES = ("docker", "podman")

# The kas image's Debian release per Yocto series: one the series' poky lists in
# SANITY_TESTED_DISTROS (kirkstone and scarthgap stop at debian-12, wrynose adds debian-13).
# kas publishes both variants of every release (kas's release.yml: debian-bookworm, debian-trixie).
IMAGE_DISTRO_BY_SERIES = {"kirkstone": "debian-bookworm", "scarthgap": "debian-bookworm",
                          "wrynose": "debian-trixie"}
KAS_IMAGE_PATH = "ghcr.io/siemens/kas/kas"  # kas-container's default image (path and name)

# What kas-container 5.5 itself passes into the container from its environment: these
# directories as mounts (its forward_dir) and these variables (its own list). Any other
# variable of this host stays outside.
KAS_CONTAINER_MOUNTED = ("KAS_WORK_DIR", "KAS_BUILD_DIR", "DL_DIR", "SSTATE_DIR", "KAS_REPO_REF_DIR")
KAS_CONTAINER_PASSED = ("KAS_CLONE_DEPTH", "KAS_PREMIRRORS", "BB_NUMBER_THREADS", "PARALLEL_MAKE", "BB_HASHSERVE",
                        "BB_HASHSERVE_UPSTREAM", "SSTATE_MIRRORS")
# Settings of ours that kas-container would leave outside: a native build honours them.
NOT_CARRIED = ("TMPDIR",)
# Variables of our kas files' env: that name a file on this host: mounted read-only here.
KEY_FILE_VARIABLES = ("MENDER_ARTIFACT_SIGNING_KEY", "MENDER_ARTIFACT_VERIFY_KEY")
KEYS_IN_CONTAINER = "/run/gpu-k8s-keys"
# kas-container splits --runtime-args on white space and expands globs in it, and mounts
# these directories with unquoted arguments: values with such characters cannot pass.
_UNSAFE = re.compile(r"[\s*?\[\]]")
PROBE_TIMEOUT_S = 30.0
RESOLVE_TIMEOUT_S = 5.0


class ContainerError(Exception):
    """kas-container is missing from the tooling venv."""


def kas_container_executable() -> Path:
    """kas-container from the tooling venv this runs in (pip installs it with kas)."""
    beside_python = Path(sys.executable).parent / "kas-container"
    if beside_python.exists():
        return beside_python
    found = shutil.which("kas-container")
    if found:
        return Path(found)
    raise ContainerError("kas-container is not installed (it comes with kas in .venvs/tools): "
                         "run ./task again to rebuild the tooling venv")


def script_version(script: Path) -> str:
    """The kas version kas-container runs (KAS_CONTAINER_SCRIPT_VERSION, which names the image)."""
    match = re.search(r'^KAS_CONTAINER_SCRIPT_VERSION="([^"]+)"', script.read_text(), re.M)
    if not match:
        raise ContainerError(f"{script} names no KAS_CONTAINER_SCRIPT_VERSION: not kas's kas-container")
    return match.group(1)


def series_of(kas_files: Sequence[Path]) -> str | None:
    """The Yocto series a kas argument builds: the series file its includes name."""
    for document in preflight.kas_documents(kas_files):
        for entry in (document.get("header") or {}).get("includes") or []:
            if isinstance(entry, str) and Path(entry).stem in IMAGE_DISTRO_BY_SERIES:
                return Path(entry).stem
    return None


def kas_image(version: str, series: str | None, environ: Mapping[str, str]) -> str:
    """The image kas-container will run: KAS_CONTAINER_IMAGE when set, else kas's own image of
    that version on the series' Debian (KAS_CONTAINER_IMAGE_DISTRO when set)."""
    if environ.get("KAS_CONTAINER_IMAGE"):
        return environ["KAS_CONTAINER_IMAGE"]
    distro = environ.get("KAS_CONTAINER_IMAGE_DISTRO") or IMAGE_DISTRO_BY_SERIES.get(series or "", "")
    return f"{KAS_IMAGE_PATH}:{version}-{distro}" if distro else f"{KAS_IMAGE_PATH}:{version}"


def requested_engine(option: str | None, environ: Mapping[str, str]) -> tuple[str | None, str]:
    """The engine asked for and by what: --engine, else kas-container's own variables."""
    if option:
        return option, "--engine"
    for name in ("KAS_CONTAINER_ENGINE", "KAS_DOCKER_ENGINE"):
        if environ.get(name):
            return environ[name], name
    return None, ""


# ---------------------------------------------------------------- the engine


@dataclass(frozen=True)
class EngineState:
    """One container engine as this host has it."""

    name: str
    installed: bool = False
    # docker: `docker -v` says "Docker ..."; podman's docker shim says "podman ...", which
    # kas-container (and so this) does not take for docker
    genuine: bool = True
    answers: bool = False  # `<engine> info` works: the daemon runs and this user may use it
    error: str = ""  # why it does not answer (its last line)
    has_image: bool = False  # the kas image is already on this host


@dataclass(frozen=True)
class EngineChoice:
    engine: str | None
    why: str
    problems: list[hostcheck.Problem] = field(default_factory=list)


def _run_quiet(argv: Sequence[str]) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def gather_engine_facts(image: str, which: Callable[[str], str | None] = shutil.which) -> dict[str, EngineState]:
    states = {}
    for name in ENGINES:
        if which(name) is None:
            states[name] = EngineState(name)
            continue
        version = _run_quiet([name, "-v"])
        genuine = name != "docker" or (version is not None and version.stdout.startswith("Docker"))
        info = _run_quiet([name, "info"])
        answers = info is not None and info.returncode == 0
        error = "" if answers else ("no answer within 30 s" if info is None else
                                    _last_line(info.stderr) or f"exit status {info.returncode}")
        inspected = _run_quiet([name, "image", "inspect", image]) if answers else None
        states[name] = EngineState(name, True, genuine, answers, error,
                                   inspected is not None and inspected.returncode == 0)
    return states


def _engine_fix(state: EngineState) -> str:
    other = "podman" if state.name == "docker" else "docker"
    if not state.installed:
        install = ("sudo apt-get install podman (rootless, no daemon)" if state.name == "podman"
                   else "sudo apt-get install docker.io, then sudo usermod -aG docker $USER and log in again")
        return f"{install}; or --engine {other}"
    if "permission denied" in state.error.lower():
        return (f"let this user use {state.name}: sudo usermod -aG docker $USER, then log in again; "
                f"or --engine {other}")
    if state.name == "docker":
        return f"start its daemon: sudo systemctl start docker; or --engine {other}"
    return f"see `podman info`; or --engine {other}"


def choose_engine(requested: str | None, source: str, states: Mapping[str, EngineState]) -> EngineChoice:
    """Which engine runs the build. Asked for (--engine, KAS_CONTAINER_ENGINE): that one, which
    must answer. Otherwise kas-container's order, docker then podman, taking the first that
    answers (kas-container itself would take an installed docker whose daemon is down)."""
    if requested:
        state = states[requested]
        if not state.installed:
            return EngineChoice(None, "", [hostcheck.Problem(
                f"{source} asks for {requested}, which is not installed", _engine_fix(state))])
        if not state.answers:
            return EngineChoice(None, "", [hostcheck.Problem(
                f"{source} asks for {requested}, which does not answer: {state.error}", _engine_fix(state))])
        return EngineChoice(requested, f"{requested} ({source})")
    candidates = [states[name] for name in ENGINES if states[name].installed and states[name].genuine]
    for state in candidates:
        if state.answers:
            passed = [f"{other.name} does not answer: {other.error}" for other in candidates
                      if other is not state and ENGINES.index(other.name) < ENGINES.index(state.name)]
            detail = f"; {passed[0]}" if passed else ""
            return EngineChoice(state.name, f"{state.name} (the first of docker, podman that answers{detail}; "
                                            "--engine docker|podman forces one)")
    if not candidates:
        return EngineChoice(None, "", [hostcheck.Problem(
            "no container engine: --container needs docker or podman",
            "sudo apt-get install podman (runs rootless, no daemon), or docker.io and sudo usermod -aG docker $USER "
            "(docs/tooling.md, 'Building in a container')")])
    return EngineChoice(None, "", [hostcheck.Problem(f"{state.name} does not answer: {state.error}", _engine_fix(state))
                                   for state in candidates])


# ---------------------------------------------------------------- the network


@dataclass(frozen=True)
class NetworkFacts:
    unresolved: tuple[str, ...] = ()  # of the hosts asked about, those this host cannot resolve
    proxy: str = ""  # an http(s) proxy resolves names itself: nothing is checked then


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, 443)
    except (OSError, UnicodeError):
        return False
    return True


def gather_network_facts(hosts: Iterable[str], environ: Mapping[str, str],
                         resolves: Callable[[str], bool] = _resolves) -> NetworkFacts:
    proxy = next((environ[name] for name in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY")
                  if environ.get(name)), "")
    wanted = sorted(set(hosts))
    if proxy or not wanted:
        return NetworkFacts(proxy=proxy)
    pool = ThreadPoolExecutor(max_workers=len(wanted))
    futures = {host: pool.submit(resolves, host) for host in wanted}
    unresolved = []
    for host, future in futures.items():
        try:
            ok = future.result(timeout=RESOLVE_TIMEOUT_S)
        except FutureTimeout:
            ok = False
        if not ok:
            unresolved.append(host)
    pool.shutdown(wait=False, cancel_futures=True)
    return NetworkFacts(tuple(unresolved))


def registry_of(image: str) -> str:
    """The registry host of an image reference (docker.io for a bare name)."""
    first = image.split("/", 1)[0]
    return first if "/" in image and ("." in first or ":" in first or first == "localhost") else "docker.io"


def layer_repositories(kas_files: Sequence[Path]) -> dict[str, str]:
    """name -> git URL of every repository kas checks out for this kas argument."""
    repos: dict[str, str] = {}
    for document in preflight.kas_documents(kas_files):
        for name, repo in (document.get("repos") or {}).items():
            if isinstance(repo, dict) and repo.get("url"):
                repos[name] = repo["url"]
    return repos


def hosts_to_reach(image: str, has_image: bool, repos: Mapping[str, str], work_dir: Path,
                   environ: Mapping[str, str]) -> tuple[str, ...]:
    """What this build must reach before bitbake starts: the kas image's registry (unless the
    image is here), the layers' git servers (unless local clones are given or already checked out)."""
    hosts = [] if has_image else [registry_of(image)]
    if not (environ.get("KAS_REPO_REF_DIR") or environ.get("KAS_PREMIRRORS")):
        hosts += [urlsplit(url).hostname or "" for name, url in repos.items()
                  if not (work_dir / name / ".git").exists()]
    return tuple(sorted({host for host in hosts if host}))


def network_problems(image: str, has_image: bool, network: NetworkFacts) -> list[hostcheck.Problem]:
    if not network.unresolved:
        return []
    registry = registry_of(image)
    problems = []
    if registry in network.unresolved:
        problems.append(hostcheck.Problem(
            f"the kas image {image} is not on this host and {registry} does not resolve (no network?)",
            f"connect this host; or on one with network run `docker pull {image} && docker save {image} -o kas.tar`, "
            "copy kas.tar here and `docker load -i kas.tar` (podman: the same commands)"))
    git_hosts = [host for host in network.unresolved if host != registry]
    if git_hosts:
        problems.append(hostcheck.Problem(
            f"kas clones the layers from {', '.join(git_hosts)}, which do not resolve here (no network?)",
            "connect this host, or give local clones: --repo-ref-dir DIR (KAS_REPO_REF_DIR) or KAS_PREMIRRORS "
            "(docs/tooling.md)"))
    return problems


# ---------------------------------------------------------------- what goes into the container


@dataclass(frozen=True)
class RuntimeArguments:
    args: tuple[str, ...] = ()  # for kas-container --runtime-args
    problems: tuple[hostcheck.Problem, ...] = ()


def runtime_arguments(kas_env: Iterable[str], environ: Mapping[str, str]) -> RuntimeArguments:
    """The variables our kas files list under env: that kas-container does not pass itself
    (the release version, the signing keys): passed with -e; key files mounted read-only."""
    args: list[str] = []
    problems = []
    for name in sorted(set(kas_env) - set(KAS_CONTAINER_PASSED) - set(KAS_CONTAINER_MOUNTED)):
        value = environ.get(name)
        if not value:
            continue
        if _UNSAFE.search(value):
            problems.append(hostcheck.Problem(
                f"{name}={value!r} holds a space or a glob character, which kas-container's --runtime-args cannot "
                "carry into the container", f"use a value (or a path) without them for {name}"))
            continue
        if name in KEY_FILE_VARIABLES:
            inside = f"{KEYS_IN_CONTAINER}/{name.lower().replace('_', '-')}.pem"
            args += ["-v", f"{Path(value).absolute()}:{inside}:ro", "-e", f"{name}={inside}"]
        else:
            args += ["-e", f"{name}={value}"]
    return RuntimeArguments(tuple(args), tuple(problems))


def environment_problems(env: Mapping[str, str], environ: Mapping[str, str]) -> list[hostcheck.Problem]:
    """Settings a container build cannot honour as a native one does."""
    problems = []
    for name in NOT_CARRIED:
        if environ.get(name):
            problems.append(hostcheck.Problem(
                f"{name} is set, but kas-container does not pass it into the container (the build would use "
                f"its own and the artifacts would not be where {name} says)",
                f"unset {name} for --container (the build's tmp/ stays in its build dir)"))
    for name in KAS_CONTAINER_MOUNTED:
        value = env.get(name, "")
        if _UNSAFE.search(value):
            problems.append(hostcheck.Problem(
                f"{name} {value!r} holds a space or a glob character, which kas-container cannot mount",
                "use a path without them (GPU_K8S_BUILD_ROOT, --build-dir, --dl-dir, --sstate-dir)"))
    return problems


def site_conf_keys_problem(kas_files: Sequence[Path], env: Mapping[str, str], site_conf: Path) -> str:
    """Keys bitbake would take from site.conf are paths on this host, which the container does not see."""
    if not preflight.builds_ab_images(kas_files):
        return ""
    settings = preflight.release_settings(env, site_conf)
    in_site_conf = [name for name in KEY_FILE_VARIABLES
                    if name in settings and settings[name].source == str(site_conf)]
    if not in_site_conf:
        return ""
    return (f"{' and '.join(in_site_conf)} come from {site_conf}, a path on this host the container does not "
            f"see: export {' and '.join(in_site_conf)} in the environment instead (./task mounts the files into the "
            "container) and remove them from site.conf")


def build_command(image_target: str, kas_argument: str, env: Mapping[str, str], environ: Mapping[str, str],
                  engine: str | None, runtime: RuntimeArguments, script: Path, series: str | None) -> process.Command:
    """`kas-container [--runtime-args ...] build --target IMAGE KASFILES` with the build's
    environment, the engine chosen and the image's Debian for the series."""
    container_env = dict(env)
    if engine:
        container_env["KAS_CONTAINER_ENGINE"] = engine
    if not environ.get("KAS_CONTAINER_IMAGE") and not environ.get("KAS_CONTAINER_IMAGE_DISTRO") \
            and series in IMAGE_DISTRO_BY_SERIES:
        container_env["KAS_CONTAINER_IMAGE_DISTRO"] = IMAGE_DISTRO_BY_SERIES[series]
    options = ["--runtime-args", " ".join(runtime.args)] if runtime.args else []
    return process.Command(argv=[str(script), *options, "build", "--target", image_target, kas_argument],
                           cwd=REPO_ROOT, env=container_env)


def prepare_dirs(env: Mapping[str, str]) -> None:
    """kas-container needs the kas work dir to exist (it makes the others itself)."""
    os.makedirs(env["KAS_WORK_DIR"], exist_ok=True)
