"""`build`: run kas with our kas files, after checking the host can take it."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tools import console, process
from tools.image import hostcheck, kas_config, preflight
from tools.image import manifest as image_manifest
from tools.image import requirements as req
from tools.paths import BUILD_ROOT, REPO_ROOT
from tools.usage import UsageError

ROLES = ("server", "agent")
# What `--role` adds to the machine's kas file when the role is not the machine's default: the
# k3s role (GPU_K8S_K3S_ROLE) and a Mender device type of its own, so a release's agent image
# never reaches a server node of the same machine, nor the reverse (docs/fleet.md).
ROLE_INCLUDES = {"agent": "kas/include/agent.yml", "server": "kas/include/server.yml"}
# The Mender payload each scheme writes: meta-mender's rootfs-image (x86-64, QEMU, the Nano's
# jetpack4 layer), meta-mender-tegra's native scheme's module image on the Orin and Thor
# (image_types_mender_tegra_native.bbclass: TEGRA_NATIVE_ARTIFACT_TYPE).
ROOTFS_PAYLOAD = "rootfs-image"
TEGRA_NATIVE_PAYLOAD = "tegra-rootfs-image"


@dataclass(frozen=True)
class MachineTarget:
    """What `--machine NAME` means: the kas file, the Yocto MACHINE it sets (for the
    deploy directory), the image built when --target is not given, the k3s role the image
    takes unless --role says otherwise (meta-gpu-k8s/classes/gpu_k8s_role.bbclass) and the
    payload type of its update artifacts."""

    kas_file: str
    yocto_machine: str
    default_image: str
    kinds: tuple[str, ...] = ()  # which image/requirements.py lists the image must meet
    default_role: str = "server"
    update_payload: str = ROOTFS_PAYLOAD
    board: str = ""  # what it runs on, for people choosing a --machine


# The one table to edit when kas files are renamed or machines are added.
MACHINES: dict[str, MachineTarget] = {
    "qemu": MachineTarget("kas/qemu-x86-64.yml", "qemux86-64", "gpu-k8s-image-dev", (req.X86_64, req.QEMU),
                          board="a QEMU VM with simulated GPUs, for ./task smoke-test"),
    "x86-64": MachineTarget("kas/x86-64.yml", "genericx86-64", "gpu-k8s-image", (req.X86_64, req.NVIDIA),
                            board="an x86-64 PC with an NVIDIA GPU"),
    # the same PC on Yocto 5.0 scarthgap (x86-64 and QEMU above are on 6.0 wrynose); the NVIDIA
    # stack is off there by default (its Go cannot build toolkit 1.20)
    "x86-64-scarthgap": MachineTarget("kas/x86-64-scarthgap.yml", "genericx86-64", "gpu-k8s-image", (req.X86_64,),
                                      board="the same PC on Yocto 5.0 scarthgap, without the NVIDIA stack"),
    # a 4 GB Nano is an agent: the control plane would take memory its GPU shares
    "jetson-nano": MachineTarget("kas/jetson-nano.yml", "jetson-nano-devkit", "gpu-k8s-image", (req.JETSON,),
                                 default_role="agent", board="Jetson Nano devkit, SD card or eMMC module"),
    # Jetson Orin (wrynose): the Orin Nano devkit with its rootfs on NVMe; the other Orin
    # machines are the same kas file with a machine override (docs/layer.md, "Jetson Orin").
    "jetson-orin-nano": MachineTarget(
        "kas/jetson-orin-nano.yml", "jetson-orin-nano-devkit-nvme", "gpu-k8s-image", (req.JETSON, req.JETSON_ORIN),
        update_payload=TEGRA_NATIVE_PAYLOAD, board="Jetson Orin Nano devkit, rootfs on NVMe"),
    "jetson-orin-nano-sd": MachineTarget(
        "kas/jetson-orin-nano.yml:kas/include/machine-jetson-orin-nano-devkit.yml", "jetson-orin-nano-devkit",
        "gpu-k8s-image", (req.JETSON, req.JETSON_ORIN), update_payload=TEGRA_NATIVE_PAYLOAD,
        board="Jetson Orin Nano devkit, rootfs on its SD card"),
    "jetson-agx-orin": MachineTarget(
        "kas/jetson-orin-nano.yml:kas/include/machine-jetson-agx-orin-devkit.yml", "jetson-agx-orin-devkit",
        "gpu-k8s-image", (req.JETSON, req.JETSON_ORIN), update_payload=TEGRA_NATIVE_PAYLOAD,
        board="Jetson AGX Orin devkit, rootfs on its eMMC"),
    # Jetson AGX Thor (wrynose): the devkit (T5000 module) with its rootfs on NVMe; the T4000
    # module on the same carrier is the same kas file with a machine override (docs/layer.md,
    # "Jetson Thor").
    "jetson-agx-thor": MachineTarget(
        "kas/jetson-agx-thor.yml", "jetson-agx-thor-devkit", "gpu-k8s-image", (req.JETSON, req.JETSON_THOR),
        update_payload=TEGRA_NATIVE_PAYLOAD, board="Jetson AGX Thor devkit (T5000), rootfs on NVMe"),
    "jetson-agx-thor-t4000": MachineTarget(
        "kas/jetson-agx-thor.yml:kas/include/machine-jetson-agx-thor-t4000.yml", "jetson-agx-thor-t4000",
        "gpu-k8s-image", (req.JETSON, req.JETSON_THOR), update_payload=TEGRA_NATIVE_PAYLOAD,
        board="Jetson AGX Thor T4000 module on the devkit carrier, rootfs on NVMe"),
}
DEFAULT_MACHINE = "qemu"

# Added to the kas file by --accept-nvidia-licence: LICENSE_FLAGS_ACCEPTED for NVIDIA's driver,
# without which an image with the NVIDIA stack (x86-64) stops at parse time.
NVIDIA_LICENCE_INCLUDE = "kas/include/nvidia-licence.yml"

# Environment variables kas hands to bitbake (or uses itself); passed through untouched.
PASSTHROUGH_VARIABLES = (
    "DL_DIR",
    "SSTATE_DIR",
    "SSTATE_MIRRORS",
    "BB_NUMBER_THREADS",
    "PARALLEL_MAKE",
    "BB_HASHSERVE",
    "BB_HASHSERVE_UPSTREAM",
    "TMPDIR",
    "KAS_REPO_REF_DIR",
    "KAS_PREMIRRORS",
    "KAS_CLONE_DEPTH",
)


# kas hands bitbake only a few variables from its environment (DL_DIR, SSTATE_DIR,
# SSTATE_MIRRORS, TMPDIR, BB_HASHSERVE*) plus those a kas file lists under `env:`; these
# two of ours reach bitbake only when a kas file lists them.
NEEDS_KAS_ENV_ENTRY = ("BB_NUMBER_THREADS", "PARALLEL_MAKE")


class BuildError(Exception):
    """The build cannot start or failed; the message says why and what to do next."""


class BuildUsageError(BuildError, UsageError):
    """A --machine, --role or other option value that names nothing we build."""


@dataclass(frozen=True)
class BuildOptions:
    machine: str = DEFAULT_MACHINE
    target: str | None = None
    build_dir: Path | None = None
    settings: Mapping[str, str] = field(default_factory=dict)  # from options, win over env
    min_free_gb: int = hostcheck.DEFAULT_MIN_FREE_GB
    dry_run: bool = False
    verbose: bool = False
    accept_nvidia_licence: bool = False
    role: str | None = None  # None: the machine's default role


def with_licence(kas_file: str, accept_nvidia_licence: bool) -> str:
    """The kas file argument, with the licence include appended when the user accepted it."""
    return f"{kas_file}:{NVIDIA_LICENCE_INCLUDE}" if accept_nvidia_licence else kas_file


def machine_choices() -> str:
    """Every --machine with its board and default role, for the tasks' help."""
    return "; ".join(f"{name}: {target.board} [{target.default_role}]" for name, target in MACHINES.items())


def machine_target(machine: str) -> MachineTarget:
    try:
        return MACHINES[machine]
    except KeyError:
        raise BuildUsageError(
            f"unknown machine {machine!r}; choose one of: {', '.join(MACHINES)}"
        ) from None


def checked_role(role: str | None) -> str | None:
    if role is not None and role not in ROLES:
        raise BuildUsageError(f"--role must be server or agent, got {role!r}")
    return role


def image_role(machine: str, role: str | None) -> str:
    """The k3s role the image of `machine` is built with: --role, else the machine's default."""
    return checked_role(role) or machine_target(machine).default_role


def kas_file_for(machine: str, role: str | None = None, accept_nvidia_licence: bool = False) -> str:
    """The kas argument that builds `machine` as `role`: its kas file, the role's include
    when the role is not the machine's default, the licence include when accepted."""
    target = machine_target(machine)
    chosen = image_role(machine, role)
    kas_file = target.kas_file if chosen == target.default_role else f"{target.kas_file}:{ROLE_INCLUDES[chosen]}"
    return with_licence(kas_file, accept_nvidia_licence)


def build_name(machine: str, role: str | None = None) -> str:
    """The kas work dir's name under build/: the machine's for its default role (where builds
    made before roles existed already are), with the role appended for the other one."""
    chosen = image_role(machine, role)
    return machine if chosen == machine_target(machine).default_role else f"{machine}-{chosen}"


def image_name(options: BuildOptions) -> str:
    return options.target or machine_target(options.machine).default_image


def machine_build_dir(options: BuildOptions) -> Path:
    """Each machine and role gets its own kas work dir (layer checkouts differ per release,
    and a server and an agent image must not overwrite each other); downloads and sstate
    are shared between them."""
    return (options.build_dir or BUILD_ROOT / build_name(options.machine, options.role)).absolute()


def build_environment(options: BuildOptions, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables we set for kas: our defaults < the caller's environment < options."""
    work_dir = machine_build_dir(options)
    env = {
        "KAS_WORK_DIR": str(work_dir),
        "KAS_BUILD_DIR": str(work_dir / "build"),
        "DL_DIR": str(BUILD_ROOT / "downloads"),
        "SSTATE_DIR": str(BUILD_ROOT / "sstate-cache"),
    }
    # --build-dir wins over KAS_WORK_DIR/KAS_BUILD_DIR from the environment, as options do.
    own_dirs = () if options.build_dir else ("KAS_WORK_DIR", "KAS_BUILD_DIR")
    for name in (*own_dirs, *PASSTHROUGH_VARIABLES):
        if environ.get(name):
            env[name] = environ[name]
    # A key path is meant from where the person ran ./task; kas runs in the repository and
    # bitbake's tasks each in a directory of their own, so it goes on absolute.
    for name in preflight.KEY_VARIABLES:
        if environ.get(name):
            env[name] = str(Path(environ[name]).expanduser().absolute())
    env.update({name: value for name, value in options.settings.items() if value})
    return env


def kas_executable() -> str:
    """kas from the tooling venv this runs in, else whatever is on PATH."""
    beside_python = Path(sys.executable).parent / "kas"
    return str(beside_python) if beside_python.exists() else "kas"


def kas_build_command(options: BuildOptions, environ: Mapping[str, str]) -> process.Command:
    return process.Command(
        argv=[kas_executable(), "build", "--target", image_name(options),
              kas_file_for(options.machine, options.role, options.accept_nvidia_licence)],
        cwd=REPO_ROOT,
        env=build_environment(options, environ),
    )


def tmp_dir(env: Mapping[str, str]) -> Path:
    return Path(env["TMPDIR"]) if env.get("TMPDIR") else Path(env["KAS_BUILD_DIR"]) / "tmp"


def deploy_dir(options: BuildOptions, env: Mapping[str, str]) -> Path:
    return tmp_dir(env) / "deploy" / "images" / machine_target(options.machine).yocto_machine


def built_deploy_dir(machine: str, role: str | None = None, work_dir: Path | None = None,
                     environ: Mapping[str, str] | None = None) -> Path:
    """Where `./task build --machine M [--role R] [--build-dir W]` leaves its images: what
    flash and release look in. `work_dir` is build's --build-dir (the kas work dir); the kas
    build dir inside it (W/build) is taken as meant too."""
    options = BuildOptions(machine=machine, role=role, build_dir=work_dir)
    env = build_environment(options, os.environ if environ is None else environ)
    if work_dir is not None and not (work_dir / "build").is_dir() and (work_dir / "tmp").is_dir():
        env["KAS_BUILD_DIR"] = str(work_dir.absolute())
    return deploy_dir(options, env)


def check_built_image(options: BuildOptions, env: Mapping[str, str]) -> list[req.Finding]:
    """The built image's manifest against the same list `./task check-image` uses.
    Raises BuildError when the build left no manifest."""
    target = machine_target(options.machine)
    pkgdata = tmp_dir(env) / "pkgdata" / target.yocto_machine
    kinds = [kind for kind in target.kinds if kind != req.NVIDIA]
    if image_manifest.nvidia_from_pkgdata(pkgdata / "runtime", default=req.NVIDIA in target.kinds):
        kinds.append(req.NVIDIA)
    try:
        manifest, findings = image_manifest.check_manifest(
            deploy_dir(options, env),
            image_name(options),
            target.yocto_machine,
            kinds,
            image_manifest.cuda_packages_from_pkgdata(pkgdata / "runtime"),
            runtime_reverse=pkgdata / "runtime-reverse",
            role=options.role,  # asked for by name: the image must have taken it
        )
    except FileNotFoundError as missing:
        raise BuildError(f"the build finished but left no manifest to check: {missing}") from None
    console.step(f"checking what the image contains ({manifest.name})")
    print("\n".join(req.report_lines(findings)), flush=True)
    return findings


@dataclass(frozen=True)
class Artifact:
    path: Path
    size_bytes: int
    link_target: str | None  # stable-name symlinks point at the timestamped file


def list_artifacts(directory: Path, image: str) -> list[Artifact]:
    """The files a person wants from the deploy dir: the image's outputs and the kernel."""
    if not directory.is_dir():
        return []
    artifacts = []
    for entry in sorted(directory.iterdir()):
        if not (entry.name.startswith(image) or entry.name.startswith("bzImage")):
            continue
        if not entry.is_file():
            continue
        link = os.readlink(entry) if entry.is_symlink() else None
        artifacts.append(Artifact(entry, entry.stat().st_size, link))
    return artifacts


def kas_env_names(kas_file: Path, root: Path = REPO_ROOT) -> set[str]:
    """Names under `env:` in a kas file and the files of this repository it includes
    (kas resolves a string include relative to the repository root)."""
    names: set[str] = set()
    pending, seen = [kas_file], set()
    while pending:
        path = pending.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        config = yaml.safe_load(path.read_text()) or {}
        names.update(config.get("env") or {})
        pending.extend(root / include for include in (config.get("header") or {}).get("includes", [])
                       if isinstance(include, str))
    return names


def settings_kas_drops(env: Mapping[str, str], kas_files: Path | list[Path],
                       root: Path = REPO_ROOT) -> list[str]:
    """Settings we would pass that kas would not hand on to bitbake."""
    files = [kas_files] if isinstance(kas_files, Path) else kas_files
    wanted = [name for name in NEEDS_KAS_ENV_ENTRY if env.get(name)]
    if not wanted or not any(path.is_file() for path in files):
        return []
    listed = set().union(*(kas_env_names(path, root) for path in files))
    return [name for name in wanted if name not in listed]


def build_command_line(options: BuildOptions) -> str:
    """The build as the person would type it again (for the steps a refusal lists)."""
    parts = ["./task build", f"--machine {options.machine}"]
    parts += [f"--role {options.role}"] if options.role else []
    parts += ["--accept-nvidia-licence"] if options.accept_nvidia_licence else []
    return " ".join(parts)


def carries_nvidia(machine: str) -> bool:
    """Whether the machine's image carries NVIDIA's driver by default (GPU_K8S_NVIDIA)."""
    return req.NVIDIA in machine_target(machine).kinds


def release_check(options: BuildOptions, env: Mapping[str, str]) -> preflight.ReleaseCheck:
    """The A/B image's keys and version, from the environment kas gets and the build's site.conf."""
    kas_files = preflight.kas_paths(kas_file_for(options.machine, options.role, options.accept_nvidia_licence))
    site_conf = Path(env["KAS_BUILD_DIR"]) / "conf" / "site.conf"
    return preflight.release_check(kas_files, image_name(options), env, site_conf)


def refuse_unfit_host(options: BuildOptions, env: Mapping[str, str]) -> list[hostcheck.Problem]:
    facts = hostcheck.gather_host_facts(Path(env["KAS_BUILD_DIR"]))
    problems = hostcheck.check_build_host(facts, options.min_free_gb, next_step=build_command_line(options))
    kas_files = preflight.kas_paths(kas_file_for(options.machine, options.role, options.accept_nvidia_licence))
    site_conf = Path(env["KAS_BUILD_DIR"]) / "conf" / "site.conf"
    # Without the licence bitbake stops at parse time, after kas fetched every layer.
    licence = preflight.nvidia_licence_problem(kas_files, carries_nvidia(options.machine), site_conf)
    if licence:
        problems.append(hostcheck.Problem("NVIDIA's driver licence is not accepted", licence))
    return problems


def run_build(options: BuildOptions, environ: Mapping[str, str] | None = None) -> list[Artifact]:
    """Check the host, run `kas build`, and report the artifacts. Raises BuildError; a dry
    run that shows a problem a real build would stop at raises it too, after the commands."""
    environ = os.environ if environ is None else environ
    target = machine_target(options.machine)
    role = image_role(options.machine, options.role)
    image = image_name(options)
    command = kas_build_command(options, environ)
    kas_argument = command.argv[-1]
    console.step(f"building {image} for {options.machine} ({target.yocto_machine}) as a k3s {role} "
                 f"with {kas_argument}")

    # A machine may name the kas file with overrides after it (a.yml:b.yml): all must exist.
    kas_files = preflight.kas_paths(kas_argument)
    absent = [str(path.relative_to(REPO_ROOT)) for path in kas_files if not path.exists()]
    if absent and not options.dry_run:
        raise BuildError(
            f"{', '.join(absent)} does not exist; the layer's kas files are missing from this checkout "
            "(or renamed: update MACHINES in tools/image/build.py)"
        )
    if absent:
        console.warn(f"{', '.join(absent)} does not exist yet (continuing: --dry-run)")
    # kas's own loader and schema, on every file and include, before the host check and hours of work
    unloadable = [] if absent else kas_config.config_errors(kas_files)
    if unloadable and not options.dry_run:
        raise BuildError(f"kas cannot load {kas_argument}: {unloadable[0]}; fix the kas file (./task lint checks "
                         "every kas file against kas's schema)")
    for error in unloadable:
        console.warn(f"kas cannot load {kas_argument}: {error} (continuing: --dry-run)")

    console.step("checking the build host, the update-signing keys and the release version")
    # Before any build work: a key mender-artifact cannot read fails when bitbake signs, hours in;
    # a verify key of another pair strands every board; a version rollout refuses is found only there.
    release = release_check(options, {**environ, **command.env})
    for line in release.lines():
        console.info(line)
    problems = [*refuse_unfit_host(options, {**environ, **command.env}), *release.problems]
    for problem in problems:
        console.info(f"- {problem}")
    if problems and not options.dry_run:
        raise BuildError(
            f"this host cannot build yet ({len(problems)} problem(s) above, the first: {problems[0].reason}); "
            "fix them and run again"
        )
    if problems:
        console.warn("a real build would stop here; showing the commands anyway (--dry-run)")
    else:
        console.info("host is fit: disk, tools, user, locale, signing keys, version and licences are fine")

    dropped = settings_kas_drops(command.env, kas_files)
    if dropped:
        console.warn(
            f"{', '.join(dropped)} will not reach bitbake: kas forwards only the environment variables a kas "
            f"file lists under `env:`; set them in {Path(command.env['KAS_BUILD_DIR']) / 'conf' / 'site.conf'} "
            "instead (docs/layer.md)"
        )

    console.step("running kas (layers are fetched on the first run; bitbake then builds)")
    log_path = Path(command.env["KAS_BUILD_DIR"]) / "kas-build.log"
    if options.dry_run:
        process.run(command, dry_run=True)
        console.info(f"artifacts would be in {deploy_dir(options, command.env)}")
        stops = len(problems) + len(unloadable) + bool(absent)
        if stops:
            raise BuildError(f"dry run: a real build would stop at the {stops} problem(s) above; "
                             "fix them and run again")
        return []
    try:
        process.run_logged(command, log_path, verbose=options.verbose)
    except process.CommandFailed as failure:
        print("\n".join(failure.output_tail[-25:]))
        errors = [line for line in failure.output_tail if line.startswith("ERROR")]
        hint = preflight.offline_hint(failure.output_tail) or (
            errors[0] if errors else f"kas exited with {failure.returncode}")
        raise BuildError(
            f"build of {image} failed: {hint}\n  full log: {log_path}\n"
            f"  next step: read the log, fix the cause, then rerun {build_command_line(options)} (finished work "
            "is reused from sstate)"
        ) from None

    artifacts = list_artifacts(deploy_dir(options, command.env), image)
    rows = [
        [str(a.path), console.human_size(a.size_bytes), f"-> {a.link_target}" if a.link_target else ""]
        for a in artifacts
    ]
    console.summary(f"built {image} for {options.machine} (k3s {role})", ["artifact", "size", ""], rows)
    if not artifacts:
        where = deploy_dir(options, command.env)
        console.warn(f"the build succeeded but nothing named {image}* is in {where}")
        return artifacts
    lacking = [finding.requirement.label for finding in check_built_image(options, command.env) if not finding.ok]
    if lacking:
        raise BuildError(
            f"{image} was built but lacks {', '.join(lacking)} (why each matters: above); "
            "see docs/layer.md for what adds them, then rebuild"
        )
    return artifacts
