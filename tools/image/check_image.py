"""`check-image`: what will the image contain? Answered from bitbake's parse data in
minutes, before a build that takes hours.

kas sets up the layers and the build environment; inside it `tools/image/bitbake_probe.py`
resolves the image's runtime closure with tinfoil and writes JSON; here the closure is
checked against `requirements` (tools/image/requirements.py) and reported, missing pieces with why they matter."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from tools import console, process
from tools.image import build, hostcheck, preflight
from tools.image import closure as closure_mod
from tools.image import requirements as req
from tools.paths import BUILD_ROOT, REPO_ROOT
from tools.usage import UsageError

PROBE = REPO_ROOT / "tools" / "image" / "bitbake_probe.py"


class CheckImageError(Exception):
    """The check could not run; the message says why and what to do."""


class CheckImageUsageError(CheckImageError, UsageError):
    """A --kas or other option value that names nothing to check."""


@dataclass(frozen=True)
class CheckImageOptions:
    machine: str = build.DEFAULT_MACHINE
    kas_file: str | None = None  # overrides the machine's kas file; may carry :includes
    target: str | None = None
    build_dir: Path | None = None
    verbose: bool = False
    accept_nvidia_licence: bool = False
    role: str | None = None  # None: the machine's default (with --kas: the kas files' own)


@dataclass(frozen=True)
class ProbeResult:
    image: str
    machine: str
    classes: list[str]
    cuda_level: str
    cuda_packages: list[str]
    closure: closure_mod.Closure

    @classmethod
    def from_json(cls, data: Mapping) -> ProbeResult:
        return cls(
            image=data["image"],
            machine=data["machine"],
            classes=req.machine_classes(data.get("machineoverrides", []), data.get("target_arch", ""),
                                        nvidia=data.get("nvidia") == "1",
                                        fabricmanager=data.get("fabricmanager") == "1"),
            cuda_level=data.get("cuda_level") or "",
            cuda_packages=list(data.get("cuda_packages") or []),
            closure=closure_mod.Closure.from_json(data["closure"]),
        )


def _closure_note(name: str, entry: closure_mod.Installed) -> str:
    parts = []
    if entry.package != name:
        parts.append(f"{entry.package} provides it")
    if entry.how == closure_mod.BY_DYNAMIC:
        parts.append(
            "dynamic package of " + entry.pn + ": made only if the kernel builds the module (built in works too)"
            if name.startswith("kernel-module-")
            else f"dynamic package of {entry.pn}: exists only if packaging makes it"
        )
    if entry.kind == closure_mod.RECOMMENDS:
        parts.append(f"recommended by {entry.via}")
    elif entry.via != closure_mod.IMAGE:
        parts.append(f"via {entry.via}")
    return "; ".join(parts)


def closure_findings(result: ProbeResult, role: str | None = None) -> list[req.Finding]:
    def has(name: str) -> tuple[str, str] | None:
        entry = result.closure.package_for(name)
        return (entry.package, _closure_note(name, entry)) if entry else None

    return req.evaluate(req.requirements_for(result.classes, result.cuda_packages, role=role), has)


def report(result: ProbeResult, findings: list[req.Finding]) -> list[str]:
    classes = ", ".join(result.classes) or "no machine-specific list"
    lines = [f"{result.image} for {result.machine} ({classes}): {len(result.closure.installed)} packages in the "
             "runtime closure"]
    if req.JETSON in result.classes:
        lines.append(f"GPU_K8S_CUDA = {result.cuda_level or '(unset)'}: {' '.join(result.cuda_packages) or 'nothing'}")
    if req.NVIDIA in result.classes:
        lines.append("GPU_K8S_NVIDIA = 1: NVIDIA driver, container toolkit and CDI unit for discrete GPUs")
    lines += req.report_lines(findings)
    for item in result.closure.unresolved:
        lines.append(f"  UNRESOLVED  {item.name} ({item.kind} of {item.via}): {item.reason}")
    lines += [f"  note: {note}" for note in result.closure.notes]
    missing = [f.requirement.label for f in findings if not f.ok]
    if missing:
        lines.append(f"{len(missing)} of {len(findings)} required pieces missing: {', '.join(missing)}")
    else:
        lines.append(f"all {len(findings)} required pieces are in the image")
    return lines


def kas_file_for(options: CheckImageOptions) -> str:
    """What `./task build` would use for the machine and role; with --kas, that file plus the
    role's include when --role is given."""
    if not options.kas_file:
        return build.kas_file_for(options.machine, options.role, options.accept_nvidia_licence)
    kas_file = options.kas_file
    if options.role is not None:
        kas_file += ":" + build.ROLE_INCLUDES[build.image_role(options.machine, options.role)]
    return build.with_licence(kas_file, options.accept_nvidia_licence)


def work_dir_for(options: CheckImageOptions) -> Path | None:
    """With --kas the work dir is named after the kas file, so it never mixes layer
    checkouts with a --machine build dir; otherwise the machine and role's build dir, whose
    checkouts and parse cache a build shares."""
    if options.build_dir or not options.kas_file:
        return options.build_dir
    stem = Path(options.kas_file.split(":", 1)[0]).stem
    return BUILD_ROOT / f"check-{stem}{f'-{options.role}' if options.role else ''}"


def build_options_for(options: CheckImageOptions) -> build.BuildOptions:
    return build.BuildOptions(machine=options.machine, build_dir=work_dir_for(options),
                              role=None if options.kas_file else options.role)


def carries_nvidia(options: CheckImageOptions) -> bool:
    """Whether the image to check carries NVIDIA's driver by default: the machine's, or with
    --kas the machine whose kas file it is (an unknown kas file: the layer's check decides)."""
    if not options.kas_file:
        return build.carries_nvidia(options.machine)
    first = options.kas_file.split(":", 1)[0].removeprefix("./")
    machines = [name for name, target in build.MACHINES.items() if target.kas_file == first]
    return bool(machines) and build.carries_nvidia(machines[0])


def probe_command(options: CheckImageOptions, image: str, out: Path, environ: Mapping[str, str]) -> process.Command:
    build_options = build_options_for(options)
    inner = shlex.join(["python3", str(PROBE), "--image", image, "--out", str(out)])
    return process.Command(
        argv=[build.kas_executable(), "shell", kas_file_for(options), "-c", inner],
        cwd=REPO_ROOT,
        env=build.build_environment(build_options, environ),
    )


def check_command(options: CheckImageOptions) -> str:
    """This check as the person typed it, for the steps a refusal lists."""
    parts = ["./task check-image"]
    parts += [f"--kas {options.kas_file}"] if options.kas_file else [f"--machine {options.machine}"]
    parts += [f"--role {options.role}"] if options.role else []
    parts += ["--accept-nvidia-licence"] if options.accept_nvidia_licence else []
    return " ".join(parts)


def image_for(options: CheckImageOptions) -> str:
    """--target, else the kas file's own `target:`, else the machine's image."""
    if options.target:
        return options.target
    if options.kas_file:
        kas = REPO_ROOT / options.kas_file.split(":", 1)[0]
        config = yaml.safe_load(kas.read_text()) if kas.is_file() else {}
        target = (config or {}).get("target") or "gpu-k8s-image"
        return target[0] if isinstance(target, list) else str(target)
    return build.machine_target(options.machine).default_image


def run_check_image(options: CheckImageOptions, environ: Mapping[str, str] | None = None,
                    euid: int | None = None) -> list[req.Finding]:
    """Resolve and check; returns the findings (the caller fails on a missing one)."""
    environ = os.environ if environ is None else environ
    kas_file = kas_file_for(options)
    for part in kas_file.split(":"):
        if not (REPO_ROOT / part).is_file():
            raise CheckImageUsageError(f"kas file {part} does not exist; give one of kas/*.yml (paths relative to "
                                       "the repository root)")
    problems = hostcheck.check_not_root(os.geteuid() if euid is None else euid, next_step=check_command(options))
    if problems:
        raise CheckImageError(f"{problems[0].reason}; fix: {problems[0].fix}")
    image = image_for(options)
    env = build.build_environment(build_options_for(options), environ)
    site_conf = Path(env["KAS_BUILD_DIR"]) / "conf" / "site.conf"
    licence = preflight.nvidia_licence_problem(preflight.kas_paths(kas_file), carries_nvidia(options), site_conf)
    if licence:
        # bitbake's parse, which this check is, would stop on it after kas fetched every layer.
        raise CheckImageError(licence)
    signing = preflight.signing_problem(preflight.kas_paths(kas_file), image, {**environ, **env}, site_conf)
    if signing:
        # Not this check's verdict, but the build's first hours depend on it.
        console.warn(f"a build of {image} would stop at do_rootfs: {signing}")
    out = Path(env["KAS_BUILD_DIR"]) / f"check-image-{image}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    command = probe_command(options, image, out, environ)
    log = Path(env["KAS_BUILD_DIR"]) / "check-image.log"
    console.step(f"resolving what {image} installs, from bitbake's parse data ({kas_file})")
    console.info("kas checks out the layers, then bitbake parses every recipe: minutes the first time, "
                 "seconds once its cache is warm")
    try:
        process.run_logged(command, log, verbose=options.verbose)
    except process.CommandFailed as failure:
        print("\n".join(failure.output_tail[-20:]))
        errors = [line for line in failure.output_tail if "ERROR" in line or "Error" in line]
        # check-image takes KAS_REPO_REF_DIR from the environment only
        hint = preflight.offline_hint(failure.output_tail, option="") or (
            errors[-1] if errors else "kas/bitbake failed")
        raise CheckImageError(f"{hint}\n  full log: {log}") from None
    result = ProbeResult.from_json(json.loads(out.read_text()))
    findings = closure_findings(result, options.role)
    print("\n".join(report(result, findings)), flush=True)
    return findings
