"""Checks that save a person hours: before any build work, can an A/B image's artifacts be
signed, and by a key its boards will accept; is its release version one the fleet tools take;
is NVIDIA's driver licence accepted where the image carries the driver; after kas failed, was
it the network.

An A/B build without keys used to fail at do_rootfs, hours in (the layer's
gpu_k8s_check_artifact_signing); the same rule (meta-gpu-k8s/lib/gpu_k8s/signing.py) runs
here first, from the environment and the build's site.conf, which is where kas and bitbake
take the keys from. Then the keys themselves (tools/mender_signing.py): a signing key
mender-artifact cannot read fails only when bitbake signs, at the end of a build, and a verify
key from another pair builds a fleet that refuses every update until each board is reflashed."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tools import mender_signing
from tools.fleet.version import version_problem
from tools.image.hostcheck import Problem
from tools.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "meta-gpu-k8s" / "lib"))
from gpu_k8s.signing import deployed_verify_key_name as deployed_verify_key_name  # for release
from gpu_k8s.signing import signing_problems

KEY_VARIABLES = (mender_signing.SIGNING_VARIABLE, mender_signing.VERIFY_VARIABLE)
SIGNING_VARIABLES = (*KEY_VARIABLES, "GPU_K8S_ARTIFACT_SIGNING")
VERSION_VARIABLE = "GPU_K8S_VERSION"
DEFAULT_VERSION = "dev"  # the layer's GPU_K8S_VERSION ??= (classes/gpu_k8s_mender.bbclass)
LAYER_DEFAULT = "the layer's default"
LAYER_RULE_REASON = "update-signing keys: the A/B image's artifacts cannot be signed"  # the fix: the layer's words
# The debug image signs when keys are given (classes/gpu_k8s_mender.bbclass).
OPTIONAL_SIGNING_IMAGES = ("gpu-k8s-image-dev",)
_ASSIGNMENT = re.compile(r'^\s*(?P<name>[A-Z0-9_]+)\s*(?P<operator>\?\?=|\?=|=|:=)\s*"(?P<value>[^"]*)"')


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


@dataclass(frozen=True)
class Setting:
    value: str
    source: str  # where bitbake will take it from, for a person


def site_assignments(site_conf: Path) -> dict[str, tuple[str, str]]:
    """The release settings site.conf assigns: name -> (operator, value)."""
    try:
        lines = site_conf.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        match = _ASSIGNMENT.match(line)
        if match and match["name"] in (*SIGNING_VARIABLES, VERSION_VARIABLE):
            found[match["name"]] = (match["operator"], match["value"])
    return found


def release_settings(environ: Mapping[str, str], site_conf: Path) -> dict[str, Setting]:
    """The signing and version settings bitbake will see. bitbake takes the variables kas
    passes through from the environment first; site.conf's `=` or `:=` then wins over them,
    its `?=` and `??=` do not."""
    site = site_assignments(site_conf)
    settings = {}
    for name in (*SIGNING_VARIABLES, VERSION_VARIABLE):
        operator, value = site.get(name, ("", ""))
        if name in site and (operator in ("=", ":=") or not environ.get(name)):
            settings[name] = Setting(value, str(site_conf))
        elif environ.get(name):
            settings[name] = Setting(environ[name], "the environment")
    return settings


@dataclass(frozen=True)
class SigningKey:
    variable: str
    path: Path
    public: mender_signing.PublicKey


@dataclass
class ReleaseCheck:
    """What an A/B build bakes into its image and signs with, and why it may not start."""

    ab: bool
    version: Setting = field(default_factory=lambda: Setting(DEFAULT_VERSION, LAYER_DEFAULT))
    keys: list[SigningKey] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    def lines(self) -> list[str]:
        """What the build prints: the version and each key's fingerprint."""
        if not self.ab:
            return []
        lines = [f"release version {self.version.value} (GPU_K8S_VERSION from {self.version.source}): the artifact "
                 "name baked into the image, what ./task release and ./task rollout take as --version"]
        for key in self.keys:
            lines.append(f"{key.variable} {key.path}: {key.public.kind}, fingerprint {key.public.fingerprint}")
        if self.keys:
            pair = len(self.keys) == 2 and self.keys[0].public == self.keys[1].public
            lines.append(f"  (fingerprint: {mender_signing.FINGERPRINT_NAME}; openssl pkey -pubin -in VERIFY_KEY "
                         f"-outform DER | sha256sum prints it{'; the two match: one pair' if pair else ''})")
        return lines


def _key_file_problem(variable: str, path: Path, error: OSError) -> Problem:
    return Problem(f"{variable} ({path}) cannot be read: {error.strerror or error}",
                   "make it readable by the user who builds (chmod 600 it, owned by that user)")


def read_keys(settings: Mapping[str, Setting]) -> tuple[list[SigningKey], list[Problem]]:
    """Both keys, parsed as mender-artifact and the Mender client read them, and whether they
    are one pair; the problems, each with its fix."""
    readers = {mender_signing.SIGNING_VARIABLE: mender_signing.signing_public_key,
               mender_signing.VERIFY_VARIABLE: mender_signing.verify_public_key}
    keys, problems = [], []
    for variable in KEY_VARIABLES:
        if variable not in settings:
            continue
        path = Path(settings[variable].value)
        try:
            keys.append(SigningKey(variable, path, readers[variable](path.read_bytes(), path)))
        except OSError as error:
            problems.append(_key_file_problem(variable, path, error))
        except mender_signing.KeyProblem as problem:
            problems.append(Problem(problem.reason, problem.fix))
    if len(keys) == 2:
        mismatch = mender_signing.pair_problem(keys[0].public, keys[1].public, keys[0].path, keys[1].path)
        if mismatch:
            problems.append(Problem(mismatch.reason, mismatch.fix))
    return keys, problems


def suggested_version(version: str) -> str:
    """The nearest valid version to a refused one ('1.0 beta' -> '1.0-beta'), or an example."""
    candidate = re.sub(r"[^A-Za-z0-9._+-]+", "-", version).strip("._+-")[:63].rstrip("._+-")
    return candidate if candidate and not version_problem(candidate) else "1.4.0"


def release_check(kas_files: Path | Iterable[Path], image: str, environ: Mapping[str, str],
                  site_conf: Path) -> ReleaseCheck:
    """Everything knowable about an A/B image's signing and version before kas starts."""
    kas_files = [kas_files] if isinstance(kas_files, Path) else list(kas_files)
    if not builds_ab_images(kas_files):
        return ReleaseCheck(ab=False)
    settings = release_settings(environ, site_conf)
    check = ReleaseCheck(ab=True, version=settings.get(VERSION_VARIABLE, Setting(DEFAULT_VERSION, LAYER_DEFAULT)))
    default = "optional" if image in OPTIONAL_SIGNING_IMAGES else "required"
    values = {name: setting.value for name, setting in settings.items()}
    layer_rule = signing_problems(values.get("GPU_K8S_ARTIFACT_SIGNING", default),
                                  values.get(mender_signing.SIGNING_VARIABLE),
                                  values.get(mender_signing.VERIFY_VARIABLE))
    if layer_rule:
        check.problems.append(Problem(LAYER_RULE_REASON, "; ".join(layer_rule)))
    else:  # even with signing "off", meta-mender signs with a key that is set, and installs a verify key
        check.keys, problems = read_keys(settings)
        check.problems.extend(problems)
    problem = version_problem(check.version.value)
    if problem:
        check.problems.append(Problem(
            f"GPU_K8S_VERSION (from {check.version.source}) {problem}",
            f"set a valid one, e.g. GPU_K8S_VERSION={suggested_version(check.version.value)} "
            "./task build ...: it is the artifact name, and ./task rollout refuses any other"))
    return check


def signing_problem(kas_file: Path | Iterable[Path], image: str, environ: Mapping[str, str], site_conf: Path) -> str:
    """One line saying what to fix, or '' when the build's artifacts can be signed as required
    and its version is valid."""
    return "; ".join(problem.fix if problem.reason == LAYER_RULE_REASON else f"{problem.reason}; fix: {problem.fix}"
                     for problem in release_check(kas_file, image, environ, site_conf).problems)


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
