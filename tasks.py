"""invoke tasks for meta-gpu-k8s: `./task --list`, `./task --help TASK`.

Only wiring lives here; the work is in tools/ (a package per group of tasks, one module per task)."""

from __future__ import annotations

import os
from pathlib import Path

from invoke import Context, Exit, task

from tools import console
from tools.dev import lint as lint_module
from tools.dev import suite as suite_module
from tools.flash import flash as flash_module
from tools.flash import provision as provision_module
from tools.flash import targets as flash_targets_module
from tools.fleet import release as release_module
from tools.fleet import rollout as rollout_module
from tools.fleet import status as status_module
from tools.image import build as build_module
from tools.image import check_image as check_image_module
from tools.paths import BUILD_ROOT
from tools.smoke import smoke_test as smoke_module
from tools.usage import exit_status


def _optional_path(value: str | None) -> Path | None:
    return Path(value).expanduser() if value else None


def _refuse(failure: Exception) -> Exit:
    """A task's error in one line; exit status 2 for a usage error, 1 for a refusal (tools/usage.py)."""
    console.error(str(failure))
    return Exit(code=exit_status(failure))


def _default_roles() -> str:
    """Which role each machine's image takes unless --role says otherwise."""
    agents = [name for name, target in build_module.MACHINES.items() if target.default_role == "agent"]
    return f"{', '.join(agents)}: agent; every other machine: server"


def _whole_number(flag: str, value: str | int, minimum: int = 0) -> int:
    """Numeric options arrive as text (invoke's own int() cast fails with a traceback):
    a bad one is a one-line error naming the option, exit status 2."""
    try:
        number = int(str(value).strip())
    except ValueError:
        number = None
    if number is None or number < minimum:
        console.error(f"--{flag} must be a whole number >= {minimum}, got {value!r}")
        raise Exit(code=2)
    return number


ROLE_HELP = (
    f"k3s role of the image: server or agent (default: the machine's; {_default_roles()}); the other role "
    "is built in build/MACHINE-ROLE with its own Mender device type (MACHINE-ROLE), so both can be released "
    "to one fleet"
)

ACCEPT_NVIDIA_LICENCE_HELP = (
    f"accept NVIDIA's driver licence for this run (adds {build_module.NVIDIA_LICENCE_INCLUDE}); the x86-64 "
    "image carries the driver and stops at parse time without it. Read the licence first (docs/layer.md)"
)


@task(
    auto_shortflags=False,
    help={
        "machine": f"what to build for, with the k3s role its image takes unless --role says otherwise: "
        f"{build_module.machine_choices()}. Default {build_module.DEFAULT_MACHINE}",
        "target": "image recipe to build (default: gpu-k8s-image-dev for qemu, gpu-k8s-image otherwise)",
        "build-dir": "kas work dir for this machine (default build/MACHINE, or build/MACHINE-ROLE for the role "
        "that is not the machine's default; env KAS_WORK_DIR; GPU_K8S_BUILD_ROOT moves build/ as a whole)",
        "dl-dir": "bitbake download cache, shareable between builds (default build/downloads; env DL_DIR)",
        "sstate-dir": "shared-state cache (default build/sstate-cache; env SSTATE_DIR)",
        "sstate-mirrors": "SSTATE_MIRRORS value, e.g. 'file://.* https://host/sstate/PATH' "
        "(env SSTATE_MIRRORS)",
        "threads": "BB_NUMBER_THREADS: bitbake tasks in parallel (env BB_NUMBER_THREADS)",
        "parallel-make": "PARALLEL_MAKE, e.g. '-j 8' (env PARALLEL_MAKE)",
        "repo-ref-dir": "KAS_REPO_REF_DIR: reference clones of the layer repos, for offline/fast checkouts",
        "min-free-gb": "refuse to start with less free disk (GB) than this "
        f"(default {build_module.hostcheck.DEFAULT_MIN_FREE_GB})",
        "dry-run": "check the host and print the exact commands without running them",
        "verbose": "stream every line of kas/bitbake output instead of a progress line",
        "accept-nvidia-licence": ACCEPT_NVIDIA_LICENCE_HELP,
        "role": ROLE_HELP,
        "container": "build inside kas's own container (kas-container, the kas version requirements/tools.txt pins) "
        "with docker or podman: no Yocto host packages needed; the same kas file, work dir, caches and checks",
        "engine": "with --container: docker or podman (default: KAS_CONTAINER_ENGINE, else the first of docker, "
        "podman that answers)",
    }
)
def build(
    c: Context,
    machine: str = build_module.DEFAULT_MACHINE,
    target: str | None = None,
    build_dir: str | None = None,
    dl_dir: str | None = None,
    sstate_dir: str | None = None,
    sstate_mirrors: str | None = None,
    threads: str | None = None,
    parallel_make: str | None = None,
    repo_ref_dir: str | None = None,
    min_free_gb: str = str(build_module.hostcheck.DEFAULT_MIN_FREE_GB),
    dry_run: bool = False,
    verbose: bool = False,
    accept_nvidia_licence: bool = False,
    role: str | None = None,
    container: bool = False,
    engine: str | None = None,
) -> None:
    """Build an OS image with kas (default: the QEMU image the smoke test boots).

    Checks the host first (free disk, host tools, not root, locale, the NVIDIA licence where
    the image carries the driver) and, for an A/B image, the update-signing keys (readable by
    mender-artifact, one pair) and GPU_K8S_VERSION; refuses with the reason and the fix;
    --dry-run shows the same, the version and both keys' fingerprints, and exits 1 when a real
    build would stop. Relative key paths are taken from the current directory. --container runs
    the same build in kas's container with docker or podman instead (no Yocto host packages;
    checks the engine and the network instead of host tools). Each machine and
    role has its own kas work dir under build/ (build/MACHINE for its default role,
    build/MACHINE-ROLE for the other), where ./task flash and ./task release find the image;
    downloads and sstate are shared. Ends with the artifacts in the deploy directory, with
    their sizes, and the image's manifest checked."""
    if threads is not None:
        _whole_number("threads", threads, minimum=1)
    settings = {
        "DL_DIR": dl_dir,
        "SSTATE_DIR": sstate_dir,
        "SSTATE_MIRRORS": sstate_mirrors,
        "BB_NUMBER_THREADS": threads,
        "PARALLEL_MAKE": parallel_make,
        "KAS_REPO_REF_DIR": repo_ref_dir,
    }
    options = build_module.BuildOptions(
        machine=machine,
        target=target,
        build_dir=_optional_path(build_dir),
        settings={key: str(Path(v).expanduser().absolute()) if key.endswith("_DIR") else v
                  for key, v in settings.items() if v},
        min_free_gb=_whole_number("min-free-gb", min_free_gb),
        dry_run=dry_run,
        verbose=verbose,
        accept_nvidia_licence=accept_nvidia_licence,
        role=role,
        container=container,
        engine=engine,
    )
    try:
        build_module.run_build(options)
    except build_module.BuildError as failure:
        raise _refuse(failure) from None


@task(
    auto_shortflags=False,
    help={
        "machine": f"which image to check: {', '.join(build_module.MACHINES)} "
        f"(default {build_module.DEFAULT_MACHINE}); ignored with --kas",
        "kas": "a kas file (with :includes) instead of --machine, e.g. kas/jetson-nano.yml:kas/local.yml",
        "target": "image recipe to check (default: the machine's image; with --kas the kas file's target)",
        "build-dir": "kas work dir (default: the one ./task build uses for the machine; env KAS_WORK_DIR)",
        "verbose": "stream kas/bitbake output instead of a progress line",
        "accept-nvidia-licence": ACCEPT_NVIDIA_LICENCE_HELP,
        "role": ROLE_HELP + "; the check then asks for that role's k3s unit",
    }
)
def check_image(
    c: Context,
    machine: str = build_module.DEFAULT_MACHINE,
    kas: str | None = None,
    target: str | None = None,
    build_dir: str | None = None,
    verbose: bool = False,
    accept_nvidia_licence: bool = False,
    role: str | None = None,
) -> None:
    """Check what an image will contain, from bitbake's parse data, in minutes instead of a build.

    Through kas and bitbake's tinfoil, resolves the image's runtime closure (IMAGE_INSTALL,
    RDEPENDS/RRECOMMENDS, packagegroups, machine extras, kernel modules) and checks it holds
    what the node needs: on Jetson the GPU driver, CUDA libraries and NVIDIA runtime; on
    x86-64 the netfilter modules k3s loads and the NVIDIA driver, toolkit and CDI unit;
    everywhere docker, k3s and the plugin; on an A/B image, that every piece of state an update
    must keep (docker's, containerd's, k3s's, the kubelet's, SSH host keys, network settings,
    machine-id), at the paths the image's own configuration gives, is kept on /data. Prints
    what is missing or not kept and why it matters; exit status 1 when something is."""
    options = check_image_module.CheckImageOptions(
        machine=machine, kas_file=kas, target=target, build_dir=_optional_path(build_dir), verbose=verbose,
        accept_nvidia_licence=accept_nvidia_licence, role=role,
    )
    try:
        if not kas:
            build_module.machine_target(machine)
        build_module.checked_role(role)
        findings = check_image_module.run_check_image(options)
    except (check_image_module.CheckImageError, build_module.BuildError) as failure:
        raise _refuse(failure) from None
    if any(not finding.ok for finding in findings):
        raise Exit(code=1)


@task(
    auto_shortflags=False,
    help={
        "machine": f"which board: {', '.join(flash_targets_module.flashable_machines())} (default jetson-nano)",
        "method": "default full. Nano: full (doflash.sh over USB), spi-only (QSPI firmware of SD devkits), sdcard "
        "(dosdcard.sh makes an SD image, written to --device when given). Orin: full (initrd-flash over USB: QSPI "
        "and the NVMe, SD card or eMMC), spi-only, external-only, sdcard or external (dosdcard.sh/doexternal.sh "
        "write --device). "
        "Thor: full (initrd-flash over USB: QSPI and NVMe), spi-only, external-only; nothing of this host is "
        "written. x86-64 and --sd-image: leave it out (the image file goes to --device as it is)",
        "image": f"image recipe whose package or disk image to use (default {flash_module.NANO.default_image})",
        "build-dir": "the machine's build, as given to ./task build --build-dir (default build/MACHINE, "
        "build/MACHINE-ROLE for a --role that is not the machine's default)",
        "package": "a tegraflash package (.tegraflash.tar.gz; Orin, Thor: .tegraflash-tar.zst) instead of the build's",
        "sd-image": "write this SD card or disk image (.sdcard, .uefiimg) to --device with bmaptool; no tegraflash",
        "device": "the whole disk to write, e.g. /dev/sdX or /dev/disk/by-id/usb-...: an SD card, the Orin's NVMe "
        "drive in a USB adapter, an x86-64 node's drive (shown with model, size and partitions first)",
        "force-device": "write this device although it is not removable (an internal drive); must equal --device. "
        "Nothing lifts the other refusals: this host's own disk, a mounted or swap device, a read-only or too "
        "small one",
        "yes": "do not ask to type the device path (only for a device that passes every check)",
        "output": "where to keep the SD image dosdcard.sh makes (default: beside the tegraflash package)",
        "dry-run": "check everything and print every command; write nothing",
        "server-url": "provisioning: the k3s server this node joins, https://HOST:6443 (with --token-file)",
        "token-file": "provisioning: a file holding the join token (the server's "
        "/var/lib/rancher/k3s/server/node-token)",
        "role": "server or agent: flash the image ./task build --role made for it and write the role into the "
        "provisioning (an agent needs --server-url and --token-file); refused when the image was built as the "
        "other. Without it: the one role's image that was built",
        "label": "provisioning: a node label KEY=VALUE (repeat for more)",
    },
    iterable=["label"],
)
def flash(
    c: Context,
    machine: str = "jetson-nano",
    method: str | None = None,
    image: str = flash_module.NANO.default_image,
    build_dir: str | None = None,
    package: str | None = None,
    sd_image: str | None = None,
    device: str | None = None,
    force_device: str | None = None,
    yes: bool = False,
    output: str | None = None,
    dry_run: bool = False,
    server_url: str | None = None,
    token_file: str | None = None,
    role: str | None = None,
    label: list[str] | None = None,
) -> None:
    """Flash a Jetson in USB recovery mode, or write an SD card, NVMe drive or x86-64 disk.

    Finds the board by its USB id in recovery mode (Nano 0955:7f21, Orin Nano 0955:7523, AGX
    Orin 0955:7023, AGX Thor devkit 0955:7026, Thor T4000 0955:7226), unpacks the tegraflash
    package from the build and runs meta-tegra's scripts (Nano: doflash.sh / dosdcard.sh; Orin:
    initrd-flash / dosdcard.sh / doexternal.sh; Thor: initrd-flash only, the board writes its own
    storage), or writes an SD image or the x86-64 A/B disk image (.uefiimg) with bmaptool. initrd-flash's
    own result line decides whether a board was flashed; its logs are kept. --dry-run checks everything,
    writes nothing and exits 1 where a real run would stop. Never writes
    this host's own disk, a mounted or swap device, or one too small, with or without flags; a
    disk that is not removable only when you confirm it or name it with --force-device. With
    --server-url/--token-file/--role/--label the node's k3s provisioning is written onto its
    data partition (every A/B image: Nano, Orin, Thor, x86-64), so it joins its cluster on first boot
    and keeps that through every update."""
    options = flash_module.FlashOptions(
        method=method,
        image=image,
        build_dir=_optional_path(build_dir),
        package=_optional_path(package),
        sd_image=_optional_path(sd_image),
        device=device,
        force_device=force_device,
        yes=yes,
        output=_optional_path(output),
        dry_run=dry_run,
        root=Path(os.environ.get("GPU_K8S_HOST_ROOT", "/")),
        provisioning=provision_module.Provisioning(
            server_url=server_url, token_file=_optional_path(token_file), role=role, labels=tuple(label or ())),
    )
    try:
        lines = flash_targets_module.flash_machine(machine, options)
    except flash_module.DryRunStopped as stopped:
        console.summary("flash summary (dry run)", ["result"], [[line] for line in stopped.lines])
        raise _refuse(stopped) from None
    except flash_module.FlashError as failure:
        raise _refuse(failure) from None
    rows = [[line] for line in lines] or [["(dry run: nothing written)"]]
    console.summary("flash summary", ["result"], rows)


@task(
    auto_shortflags=False,
    help={
        "image": "A/B disk (.uefiimg, booted with the OVMF beside it) or rootfs .ext4 to boot in QEMU "
        "(default: the qemu build's gpu-k8s-image-dev)",
        "kernel": "kernel to boot (default: bzImage beside the image)",
        "initrd": "initramfs to pass to QEMU (not needed for our images)",
        "kernel-args": "extra kernel command line arguments",
        "host": "user@address of a booted board to test over SSH instead of QEMU",
        "port": "SSH port of --host (default 22)",
        "identity": "SSH private key for --host",
        "gpus": "nvidia.com/gpu count the node must advertise (default 2 in QEMU, 1 with --host)",
        "memory-mib": "QEMU guest memory in MiB (default 4096, at least 2048)",
        "boot-timeout": "seconds to wait for SSH after starting QEMU (default 600)",
        "checks-timeout": "seconds to wait for units and the node to become ready (default 300)",
        "pod-seconds": "how long the GPU-filling pods sleep (default 20)",
        "log-dir": "where the serial console log goes (default: beside the image)",
        "no-kvm": "software emulation (TCG), no KVM probe (default: KVM when a short probe boot under it works)",
        "kvm": "use KVM without probing it first (fails if KVM does not work here)",
        "kvm-probe-timeout": "seconds the KVM probe boot may take before TCG is used instead (default 20)",
        "runtime": "auto (read the node's k3s config), docker or containerd: the pod runtime the node must use",
    }
)
def smoke_test(
    c: Context,
    image: str | None = None,
    kernel: str | None = None,
    initrd: str | None = None,
    kernel_args: str = "",
    host: str | None = None,
    port: str = "22",
    identity: str | None = None,
    gpus: str | None = None,
    memory_mib: str = "4096",
    boot_timeout: str = "600",
    checks_timeout: str = "300",
    pod_seconds: str = "20",
    log_dir: str | None = None,
    no_kvm: bool = False,
    kvm: bool = False,
    kvm_probe_timeout: str = str(int(smoke_module.qemu.KVM_PROBE_TIMEOUT_S)),
    runtime: str = "auto",
) -> None:
    """Boot the QEMU image (or reach a board over SSH) and check it is a working GPU node.

    Checks: docker, k3s and gpu-device-plugin active; node Ready with the expected
    nvidia.com/gpu count; a GPU pod runs; with every GPU busy one more pod stays Pending
    (Insufficient nvidia.com/gpu) and runs once a GPU frees. QEMU is always stopped.
    KVM is used when /dev/kvm is usable and a few-second probe boot under it works;
    otherwise (and after an early QEMU crash under KVM) it falls back to TCG, saying so."""
    if image and host:
        console.error("--image and --host exclude each other: boot an image in QEMU, or test a board")
        raise Exit(code=2)
    if kvm and no_kvm:
        console.error("--kvm and --no-kvm exclude each other")
        raise Exit(code=2)
    if runtime not in ("auto", *smoke_module.RUNTIMES):
        console.error(f"--runtime must be auto, docker or containerd, got {runtime!r}")
        raise Exit(code=2)
    options = smoke_module.SmokeOptions(
        image=_optional_path(image),
        kernel=_optional_path(kernel),
        initrd=_optional_path(initrd),
        host=host,
        ssh_port=_whole_number("port", port, minimum=1),
        identity=_optional_path(identity),
        expected_gpus=_whole_number("gpus", gpus) if gpus is not None else None,
        memory_mib=_whole_number("memory-mib", memory_mib, minimum=1),
        boot_timeout_s=_whole_number("boot-timeout", boot_timeout, minimum=1),
        pod_sleep_s=_whole_number("pod-seconds", pod_seconds),
        kernel_args=kernel_args,
        log_dir=_optional_path(log_dir),
        checks_timeout_s=_whole_number("checks-timeout", checks_timeout, minimum=1),
        kvm=False if no_kvm else (True if kvm else None),
        kvm_probe_timeout_s=_whole_number("kvm-probe-timeout", kvm_probe_timeout, minimum=1),
        runtime=None if runtime == "auto" else runtime,
    )
    try:
        smoke_module.run_smoke_test(options)
    except (smoke_module.SmokeTestError, smoke_module.qemu.QemuError) as failure:
        raise _refuse(failure) from None
    except KeyboardInterrupt:
        console.error("interrupted; QEMU was stopped")
        raise Exit(code=130) from None


@task(
    auto_shortflags=False,
    help={
        "kas": "release what this kas file's builds made (both roles), e.g. kas/jetson-nano.yml (default: every "
        "machine and role that has artifacts)",
        "build-dir": "kas work dir of that build (default build/<machine> and build/<machine>-<role>; with --kas)",
        "deploy-dir": "take the artifacts from this directory instead (a copied deploy dir)",
        "output": "where the release goes (default build/release/<version>)",
        "verify-key": "public key the boards hold, when it is not the one the image carries (a key change): each "
        "signature is checked against it instead (default: the verify key each build recorded beside its image)",
    },
)
def release(
    c: Context,
    kas: str | None = None,
    build_dir: str | None = None,
    deploy_dir: str | None = None,
    output: str | None = None,
    verify_key: str | None = None,
) -> None:
    """Collect the builds' signed .mender artifacts into one directory to serve to the fleet.

    Copies each artifact, writes its sha256 (and SHA256SUMS) and release.json (version,
    machine, device types, payload type, k3s role, L4T version on Jetson, k3s version,
    artifact name, the verify key's fingerprint). Refuses unsigned or corrupt artifacts, one
    whose signature the verify key its image carries (or --verify-key) would reject, one of
    the other Mender scheme (an Orin takes tegra-rootfs-image, the others rootfs-image), and
    two for one device type; says so when nothing was built. Ends with the rollout command
    for every device type."""
    options = release_module.ReleaseOptions(
        kas=kas,
        build_dir=_optional_path(build_dir),
        deploy_dir=_optional_path(deploy_dir),
        output=_optional_path(output),
        verify_key=_optional_path(verify_key),
    )
    try:
        release_module.run_release(options)
    except release_module.ReleaseError as failure:
        raise _refuse(failure) from None


@task(
    auto_shortflags=False,
    help={
        "version": "release version to roll out (the images' MENDER_ARTIFACT_NAME), e.g. 1.4.0",
        "artifact-url": "http(s) URL of one .mender artifact that its nodes can reach (see ./task release)",
        "device-type": "the Mender device type that artifact installs on (node label "
        "update.gpu-k8s.io/device-type); default: as build/release/VERSION/release.json records it",
        "release": "a ./task release directory: roll out every artifact in its release.json, one Plan pair per "
        "device type (with --base-url)",
        "base-url": "where the nodes download the --release directory's files, e.g. http://updates.lan:8080/",
        "ring": "server: the k3s servers, one at a time, cordoned, not drained; canary: the servers, then the "
        "agents labelled update.gpu-k8s.io/ring=canary, one at a time; fleet: every other agent, after the canary "
        "Plans completed; all: the three in turn (default)",
        "concurrency": "fleet nodes updated at once (default 1; the canary ring always goes one by one)",
        "selector": "only nodes with this label, KEY=VALUE (e.g. site=lab-2)",
        "dry-run": "print the Plans' YAML; apply nothing",
    },
)
def rollout(
    c: Context,
    version: str,
    artifact_url: str | None = None,
    device_type: str | None = None,
    release: str | None = None,
    base_url: str | None = None,
    ring: str = "all",
    concurrency: str = "1",
    selector: str | None = None,
    dry_run: bool = False,
) -> None:
    """Roll an OS release over the fleet with system-upgrade-controller Plans: servers, canaries, fleet.

    Renders the server ring (every k3s server of the release's device types, one at a time,
    cordoned but not drained, each taking its own device type's artifact) and one canary and
    fleet Plan per device type, whose jobs wait for the rings before them (--dry-run prints
    them); checks the cluster (controller installed, every artifact fits some node, canary
    agents labelled per device type) and says what the control plane does meanwhile; applies
    them with kubectl (GPU_K8S_KUBECTL overrides the command, KUBECONFIG picks the cluster)
    and follows each node, through a server's reboot that takes the API server along, until
    every ring completed or a node failed its health gate and rolled back, which stops the
    rollout there. ./task status shows the same from any shell, later."""
    concurrency_value = _whole_number("concurrency", concurrency, minimum=1)
    try:
        artifacts = rollout_module.resolve_artifacts(
            version, artifact_url, device_type, _optional_path(release), base_url, BUILD_ROOT / "release")
        options = rollout_module.RolloutOptions(
            version=version,
            artifacts=artifacts,
            ring=ring,
            concurrency=concurrency_value,
            selector=selector,
            dry_run=dry_run,
        )
        rollout_module.run_rollout(options)
    except rollout_module.RolloutError as failure:
        raise _refuse(failure) from None
    except KeyboardInterrupt:
        console.error("stopped following; the Plans stay applied and the rollout goes on in the cluster")
        raise Exit(code=130) from None


@task
def status(c: Context) -> None:
    """Show where every node of the fleet stands and where the current rollout is, from the cluster.

    A table of every node (machine, k3s role, Ready and cordoned, OS release and slot, update
    state as its update agent published it: pending, committed, rolled back or failed, what the
    data check did to its /data since its last update, and allocatable nvidia.com/gpu of its
    GPUs), then each rollout Plan (ring, version, the node it is updating, what it waits for),
    then the problems. Reads the cluster with kubectl (KUBECONFIG picks it, GPU_K8S_KUBECTL
    overrides the command), changes nothing. Exit status 1 when a node failed or rolled back, a
    node's /data was made again since its last update or does not mount, a rollout job failed,
    or the cluster cannot be read."""
    try:
        found = status_module.run_status()
    except status_module.StatusError as failure:
        raise _refuse(failure) from None
    if found.problems:
        console.error(f"{len(found.problems)} problem(s): see above (docs/fleet.md, 'A failed canary, and how "
                      "to resume')")
        raise Exit(code=1)


@task
def lint(c: Context) -> None:
    """Lint everything: ruff, oelint-adv over the layer, kas files against kas's schema.

    ruff over the repository (ruff.toml), oelint-adv over meta-gpu-k8s/ once per Yocto
    series its layer.conf declares (--release kirkstone, scarthgap, wrynose; config
    .oelint.cfg), kas/*.yml validated with kas's own JSON schema.
    Parts whose files do not exist yet are skipped with a note."""
    results = lint_module.run_lint()
    if any(result.status == "FAIL" for result in results):
        raise Exit(code=1)


@task(
    auto_shortflags=False,
    help={
        "quick": "skip the Python 3.10 plugin legs (the image's libraries and stock kirkstone's); the "
        "updater tests then run on Python 3.13",
        "no-host-setup": "install nothing with apt-get and download no test kernel (QEMU tests then run "
        "only if their prerequisites are already there; env GPU_K8S_TEST_NO_HOST_SETUP=1)",
    },
)
def test(c: Context, quick: bool = False, no_host_setup: bool = False) -> None:
    """Run the whole test suite, as CI does (.ci/run calls this).

    Legs: ruff; tests/tools and tests/layer; the Kubernetes conformance leg (conformance/:
    Go >= 1.26 builds k8s.io/kubernetes at our k3s's version from the module proxy into
    build/go, skipped saying why without Go); tests/plugin on kirkstone's Python 3.10 with
    grpcio 1.66 and with 1.45 as the test clients, wrynose's (grpcio 1.78, protobuf
    6.33, on Python 3.13) and the newest (Python 3.13) library combinations, each in a venv
    under .venvs/ made when missing or stale;
    tests/updater (the node's update agent) on Python 3.10. A summary lists each leg and
    every skipped test with its reason. Exit status non-zero if any leg fails.

    For the QEMU tests it installs qemu-system-x86, busybox-static and the other host tools
    the tests run (apt-get, as root, when missing) and keeps a Debian kernel (a few MB) in
    ~/.cache/meta-gpu-k8s/test-kernel; --no-host-setup changes nothing on the host."""
    results = suite_module.run_suite(quick=quick, host_setup=not no_host_setup)
    if any(result.failed for result in results):
        raise Exit(code=1)
