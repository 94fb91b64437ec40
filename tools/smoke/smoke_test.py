"""`smoke-test`: does a booted image work as a GPU node? QEMU or a real board over SSH."""

from __future__ import annotations

import configparser
import dataclasses
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from tools import console
from tools.image.build import MACHINES, BuildOptions, deploy_dir, machine_target
from tools.image.build import build_environment as kas_environment
from tools.smoke import qemu
from tools.usage import UsageError

UNITS = ("docker", "k3s", "gpu-device-plugin")
# The QEMU image also imports the smoke and pause images into docker at boot (oneshot,
# before k3s); when it fails, pods wait for images forever, so say so up front.
QEMU_UNITS = (*UNITS, "gpu-k8s-preload-images")
# The A/B image binds node state from /data first and loads the rollout images into docker.
QEMU_AB_UNITS = (*QEMU_UNITS, "gpu-k8s-data", "gpu-k8s-fleet-images")
GPU_RESOURCE = "nvidia.com/gpu"
SMOKE_IMAGE = "localhost/gpu-k8s-smoke:latest"
POD_LABEL = "gpu-k8s-smoke"
INSUFFICIENT = f"Insufficient {GPU_RESOURCE}"
KUBECONFIG = "/etc/rancher/k3s/k3s.yaml"
# k3s runs pods through docker ("docker: true" in one of its config files, the layer's
# default) or through its own containerd; the checks differ only where the runtime does.
RUNTIMES = ("docker", "containerd")
K3S_CONFIG_FILES = "/etc/rancher/k3s/config.yaml /etc/rancher/k3s/config.yaml.d/*.yaml"


class SmokeTestError(Exception):
    pass


class SmokeTestUsageError(SmokeTestError, UsageError):
    """An option value the smoke test can never take (exit status 2)."""


@dataclass(frozen=True)
class RemoteResult:
    returncode: int
    stdout: str
    stderr: str


class SshTarget:
    """Runs shell commands on the node with the system ssh client."""

    def __init__(self, destination: str, port: int = 22, identity: Path | None = None,
                 connect_timeout_s: int = 10) -> None:
        self.destination = destination
        self.port = port
        self.identity = identity
        self.connect_timeout_s = connect_timeout_s

    def ssh_argv(self, command: str) -> list[str]:
        argv = [
            "ssh",
            "-o", "BatchMode=yes",
            # Throwaway VMs and freshly flashed boards have new host keys every time.
            "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null",
            "-o", f"ConnectTimeout={self.connect_timeout_s}",
            "-o", "LogLevel=ERROR",
            "-p", str(self.port),
        ]
        if self.identity is not None:
            argv += ["-i", str(self.identity)]
        return [*argv, self.destination, command]

    def run(self, command: str, timeout_s: float = 60, stdin: str | None = None) -> RemoteResult:
        try:
            completed = subprocess.run(
                self.ssh_argv(command), input=stdin, capture_output=True, text=True,
                timeout=timeout_s, check=False,
            )
        except subprocess.TimeoutExpired:
            return RemoteResult(124, "", f"ssh command timed out after {timeout_s:.0f} s: {command}")
        return RemoteResult(completed.returncode, completed.stdout, completed.stderr)


def kubectl(arguments: str) -> str:
    """A kubectl command line for the node (k3s installs kubectl in /usr/local/bin)."""
    return f'export PATH="$PATH:/usr/local/bin" KUBECONFIG={KUBECONFIG}; kubectl {arguments}'


def gpu_pod_manifest(name: str, sleep_s: int) -> str:
    """A pod that takes one GPU, prints what it was given and sleeps; its image ships in
    the OS image, so no registry is involved."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": POD_LABEL}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "gpu",
                    "image": SMOKE_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", f"echo $NVIDIA_VISIBLE_DEVICES; sleep {sleep_s}"],
                    "resources": {"limits": {GPU_RESOURCE: 1}, "requests": {GPU_RESOURCE: 1}},
                }
            ],
        },
    }
    return json.dumps(pod, indent=1)


# --- pure readers of the node's files and kubectl's JSON ----------------------------


def runtime_from_config(text: str) -> str:
    """The runtime k3s uses, from the concatenated text of its config files."""
    docker = any(re.fullmatch(r"docker:\s*true\s*", line) for line in text.splitlines())
    return "docker" if docker else "containerd"


def units_for_runtime(units: tuple[str, ...], runtime: str) -> tuple[str, ...]:
    """docker must be running only when k3s runs its pods through it."""
    return units if runtime == "docker" else tuple(u for u in units if u != "docker")


def image_kernel_args(rootfs: Path) -> str:
    """The kernel arguments the image asks QEMU for (QB_KERNEL_CMDLINE_APPEND in the
    qemuboot.conf bitbake writes beside it, e.g. the unified cgroup hierarchy); "" if none."""
    stem = re.sub(r"(\.rootfs)?\.ext4$", "", rootfs.name)
    conf_path = rootfs.with_name(stem + ".qemuboot.conf")
    if not conf_path.is_file():
        return ""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(conf_path)
    except configparser.Error as error:
        raise SmokeTestError(f"{conf_path} is not a qemuboot.conf: {error}") from None
    return " ".join(parser.get("config_bsp", "qb_kernel_cmdline_append", fallback="").split())


def parse_unit_states(output: str, units: tuple[str, ...] = UNITS) -> dict[str, str]:
    """`systemctl is-active a b c` prints one state per line, in order."""
    states = [line.strip() for line in output.splitlines() if line.strip()]
    return {unit: (states[index] if index < len(states) else "unknown") for index, unit in enumerate(units)}


@dataclass(frozen=True)
class NodeStatus:
    name: str
    ready: bool
    gpus_allocatable: int
    gpus_capacity: int
    runtime_version: str = ""  # e.g. docker://20.10.25, containerd://2.3.4-k3s1.36


def parse_nodes(output: str) -> list[NodeStatus]:
    nodes = []
    for item in json.loads(output).get("items", []):
        status = item.get("status", {})
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])
        )
        nodes.append(
            NodeStatus(
                name=item.get("metadata", {}).get("name", "?"),
                ready=ready,
                gpus_allocatable=int(status.get("allocatable", {}).get(GPU_RESOURCE, 0)),
                gpus_capacity=int(status.get("capacity", {}).get(GPU_RESOURCE, 0)),
                runtime_version=status.get("nodeInfo", {}).get("containerRuntimeVersion", ""),
            )
        )
    return nodes


@dataclass(frozen=True)
class PodStatus:
    name: str
    phase: str
    unschedulable_message: str


def parse_pods(output: str) -> dict[str, PodStatus]:
    pods = {}
    for item in json.loads(output).get("items", []):
        status = item.get("status", {})
        message = ""
        for condition in status.get("conditions", []):
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                message = condition.get("message", "")
        name = item.get("metadata", {}).get("name", "?")
        pods[name] = PodStatus(name, status.get("phase", "Unknown"), message)
    return pods


# --- the checks -----------------------------------------------------------------------


@dataclass
class CheckResult:
    name: str
    passed: bool | None  # None: not run because an earlier check failed
    seconds: float = 0.0
    detail: str = ""


@dataclass(frozen=True)
class CheckSettings:
    expected_gpus: int = 2
    units: tuple[str, ...] = UNITS
    pod_sleep_s: int = 20
    units_timeout_s: float = 300
    node_timeout_s: float = 300
    pod_timeout_s: float = 180
    poll_s: float = 3.0
    runtime: str | None = None  # None: read it from the node's k3s config


class CheckFailed(Exception):
    pass


@dataclass
class SmokeChecks:
    """The checks, in order; each one needs the ones before it to have passed."""

    target: Any  # anything with run(command, timeout_s, stdin) -> RemoteResult
    settings: CheckSettings = field(default_factory=CheckSettings)
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    runtime: str | None = None  # set by check_units

    def node_runtime(self) -> str:
        """The runtime the node's k3s uses: forced by the settings, else from its config files."""
        if self.runtime is None:
            self.runtime = self.settings.runtime
        if self.runtime is None:
            config = self._run(f"cat {K3S_CONFIG_FILES} 2>/dev/null; true").stdout
            self.runtime = runtime_from_config(config)
        return self.runtime

    def _poll(self, probe: Callable[[], tuple[bool, str]], timeout_s: float) -> str:
        """Call probe until it reports done; CheckFailed with its last word on timeout."""
        deadline = self.clock() + timeout_s
        while True:
            done, detail = probe()
            if done:
                return detail
            if self.clock() >= deadline:
                raise CheckFailed(f"after {timeout_s:.0f} s: {detail}")
            self.sleep(self.settings.poll_s)

    def _run(self, command: str, stdin: str | None = None) -> RemoteResult:
        return self.target.run(command, timeout_s=60, stdin=stdin)

    def _kubectl_json(self, arguments: str) -> str:
        result = self._run(kubectl(arguments + " -o json"))
        if result.returncode != 0:
            raise CheckFailed(f"kubectl {arguments} failed: {result.stderr.strip() or result.stdout.strip()}")
        return result.stdout

    def _pods(self) -> dict[str, PodStatus]:
        return parse_pods(self._kubectl_json(f"get pods -l app={POD_LABEL}"))

    def _create_pod(self, name: str, sleep_s: int) -> None:
        result = self._run(kubectl("apply -f -"), stdin=gpu_pod_manifest(name, sleep_s))
        if result.returncode != 0:
            raise CheckFailed(f"could not create pod {name}: {result.stderr.strip()}")

    def delete_pods(self) -> None:
        self._run(kubectl(f"delete pods -l app={POD_LABEL} --ignore-not-found --wait=false"))

    def check_login(self) -> str:
        result = self._run("true")
        if result.returncode != 0:
            raise CheckFailed(f"ssh failed ({result.returncode}): {result.stderr.strip()}")
        return "ssh works"

    def check_units(self) -> str:
        runtime = self.node_runtime()
        units = units_for_runtime(self.settings.units, runtime)

        def probe() -> tuple[bool, str]:
            result = self._run("systemctl is-active " + " ".join(units))
            states = parse_unit_states(result.stdout, units)
            described = ", ".join(f"{unit} {state}" for unit, state in states.items())
            return all(state == "active" for state in states.values()), f"{described} (runtime {runtime})"

        try:
            return self._poll(probe, self.settings.units_timeout_s)
        except CheckFailed as failed:
            raise CheckFailed(f"{failed} (look at `journalctl -b -u <unit>` on the node)") from None

    def check_node_ready(self) -> str:
        def probe() -> tuple[bool, str]:
            nodes = parse_nodes(self._kubectl_json("get nodes"))
            if not nodes:
                return False, "no node registered yet"
            return all(n.ready for n in nodes), ", ".join(f"{n.name} ready={n.ready}" for n in nodes)

        detail = self._poll(probe, self.settings.node_timeout_s)
        runtime = self.node_runtime()
        for node in parse_nodes(self._kubectl_json("get nodes")):
            if node.runtime_version and not node.runtime_version.startswith(f"{runtime}://"):
                raise CheckFailed(f"{node.name} runs pods through {node.runtime_version}, but k3s's config "
                                  f"says {runtime} (look at /etc/rancher/k3s/config.yaml.d/)")
        return f"{detail}, pods through {runtime}"

    def check_gpus_advertised(self) -> str:
        expected = self.settings.expected_gpus

        def probe() -> tuple[bool, str]:
            nodes = parse_nodes(self._kubectl_json("get nodes"))
            total = sum(n.gpus_allocatable for n in nodes)
            return total == expected, f"{GPU_RESOURCE} allocatable {total}, expected {expected}"

        return self._poll(probe, self.settings.node_timeout_s)

    def _wait_for_phase(self, names: list[str], phases: set[str], timeout_s: float) -> dict[str, PodStatus]:
        seen: dict[str, PodStatus] = {}

        def probe() -> tuple[bool, str]:
            nonlocal seen
            seen = self._pods()
            failed = [n for n in names if n in seen and seen[n].phase == "Failed"]
            if failed and "Failed" not in phases:
                raise CheckFailed(f"pod(s) {', '.join(failed)} failed (kubectl describe pod {failed[0]})")
            states = ", ".join(f"{n} {seen[n].phase if n in seen else 'missing'}" for n in names)
            return all(n in seen and seen[n].phase in phases for n in names), states

        self._poll(probe, timeout_s)
        return seen

    def check_single_pod(self) -> str:
        self.delete_pods()
        self._create_pod("gpu-smoke-single", sleep_s=1)
        self._wait_for_phase(["gpu-smoke-single"], {"Succeeded"}, self.settings.pod_timeout_s)
        logs = self._run(kubectl("logs gpu-smoke-single")).stdout.strip()
        if not logs:
            raise CheckFailed("the pod ran but NVIDIA_VISIBLE_DEVICES was empty: the plugin gave it no GPU")
        return f"Succeeded, NVIDIA_VISIBLE_DEVICES={logs.splitlines()[0]}"

    def fill_names(self) -> list[str]:
        return [f"gpu-smoke-fill-{index}" for index in range(self.settings.expected_gpus)]

    def check_all_gpus_busy(self) -> str:
        self.delete_pods()
        for name in self.fill_names():
            self._create_pod(name, sleep_s=self.settings.pod_sleep_s)
        self._wait_for_phase(self.fill_names(), {"Running"}, self.settings.pod_timeout_s)
        return f"{len(self.fill_names())} pod(s) Running, one GPU each"

    def check_extra_pod_pending(self) -> str:
        self._create_pod("gpu-smoke-extra", sleep_s=1)

        def probe() -> tuple[bool, str]:
            pods = self._pods()
            extra = pods.get("gpu-smoke-extra")
            if extra is None:
                return False, "gpu-smoke-extra not seen yet"
            if extra.phase != "Pending":
                raise CheckFailed(
                    f"gpu-smoke-extra is {extra.phase}, expected Pending: more GPUs than advertised?"
                )
            message = extra.unschedulable_message
            return INSUFFICIENT in message, f"Pending, scheduler says: {message or '(nothing yet)'}"

        return self._poll(probe, min(self.settings.pod_timeout_s, self.settings.pod_sleep_s))

    def check_extra_pod_runs_later(self) -> str:
        timeout = self.settings.pod_sleep_s + self.settings.pod_timeout_s
        self._wait_for_phase(["gpu-smoke-extra"], {"Succeeded"}, timeout)
        return "gpu-smoke-extra Succeeded once a GPU was free"

    def checks(self) -> list[tuple[str, Callable[[], str]]]:
        gpus = self.settings.expected_gpus
        return [
            ("ssh login", self.check_login),
            ("units active: " + ", ".join(self.settings.units) + " (docker only in docker mode)", self.check_units),
            ("node Ready", self.check_node_ready),
            (f"node advertises {GPU_RESOURCE}: {gpus}", self.check_gpus_advertised),
            ("a GPU pod runs to completion", self.check_single_pod),
            (f"every GPU in use ({gpus} pods Running)", self.check_all_gpus_busy),
            (f"one more GPU pod Pending: {INSUFFICIENT}", self.check_extra_pod_pending),
            ("that pod runs once a GPU frees up", self.check_extra_pod_runs_later),
        ]

    def run_all(self) -> list[CheckResult]:
        results: list[CheckResult] = []
        failed = False
        try:
            for name, check in self.checks():
                if failed:
                    results.append(CheckResult(name, None, detail="not run: an earlier check failed"))
                    continue
                console.step(f"check: {name}")
                started = self.clock()
                try:
                    detail = check()
                    results.append(CheckResult(name, True, self.clock() - started, detail))
                except CheckFailed as failure:
                    failed = True
                    results.append(CheckResult(name, False, self.clock() - started, str(failure)))
                console.info(("pass: " if results[-1].passed else "FAIL: ") + results[-1].detail)
        finally:
            if any(r.passed is not None and r.name.startswith(("a GPU pod", "every GPU")) for r in results):
                self.delete_pods()
        return results


# --- the task -------------------------------------------------------------------------


@dataclass(frozen=True)
class SmokeOptions:
    image: Path | None = None  # .uefiimg (A/B disk) or rootfs .ext4; default from the qemu build
    kernel: Path | None = None
    initrd: Path | None = None
    host: str | None = None  # user@ip of a real board: no QEMU
    ssh_port: int = 22
    identity: Path | None = None
    expected_gpus: int | None = None  # default: 2 in QEMU (simulated), 1 on a board
    memory_mib: int = qemu.DEFAULT_MEMORY_MIB
    boot_timeout_s: float = 600
    pod_sleep_s: int = 20
    kernel_args: str = ""
    log_dir: Path | None = None
    checks_timeout_s: float = 300
    kvm: bool | None = None  # None: KVM when /dev/kvm is usable and a probe boot works
    kvm_probe_timeout_s: float = qemu.KVM_PROBE_TIMEOUT_S
    nic_model: str = "virtio-net-pci"
    runtime: str | None = None  # docker / containerd; None: read from the node's k3s config


def find_qemu_image(environ: Mapping[str, str]) -> tuple[Path, Path]:
    """(disk or rootfs, kernel) of the default image from `./task build` (machine qemu):
    the A/B .uefiimg when the build made one (it boots through GRUB like a fleet node),
    else the ext4 root filesystem."""
    options = BuildOptions(machine="qemu")
    directory = deploy_dir(options, kas_environment(options, environ))
    image = machine_target("qemu").default_image
    for name in (f"{image}-qemux86-64.uefiimg", f"{image}-qemux86-64.rootfs.ext4", f"{image}-qemux86-64.ext4"):
        if (directory / name).exists():
            return directory / name, directory / "bzImage"
    raise SmokeTestError(
        f"no {image} .uefiimg or ext4 image in {directory}; run `./task build` first or pass --image PATH"
    )


# What QEMU can boot here: the A/B disk (through OVMF and GRUB) or a bare root filesystem.
QEMU_IMAGE_SUFFIXES = (".uefiimg", ".ext4")


def board_machine_in(name: str) -> str | None:
    """The Yocto MACHINE of a board that a file name carries (bitbake names images
    IMAGE-MACHINE...), None for qemux86-64 or a name without one."""
    boards = {target.yocto_machine for target in MACHINES.values()} - {machine_target("qemu").yocto_machine}
    return next((machine for machine in sorted(boards, key=len, reverse=True) if f"-{machine}" in name), None)


def check_bootable_in_qemu(image: Path) -> None:
    """A board's image (a Jetson .sdcard or tegraflash package, a genericx86-64 disk) does not
    boot in the smoke test's qemux86-64: say so, rather than ask for a kernel or firmware."""
    board = board_machine_in(image.name)
    if image.suffix in QEMU_IMAGE_SUFFIXES and board is None:
        return
    if board is not None:
        raise SmokeTestUsageError(
            f"--image {image.name} is a {board} image: the QEMU smoke test boots the qemux86-64 build's .uefiimg "
            "or .ext4 (./task build); flash a board's image (./task flash) and check the board with "
            "./task smoke-test --host root@BOARD"
        )
    raise SmokeTestUsageError(
        f"--image {image.name}: the QEMU smoke test boots a qemux86-64 .uefiimg or .ext4 (./task build); "
        "a board's image is flashed (./task flash) and checked with ./task smoke-test --host BOARD"
    )


OVMF_FILES = ("ovmf.code.qcow2", "ovmf.vars.qcow2")  # what oe-core's ovmf recipe deploys


def uefi_firmware(disk: Path) -> tuple[Path, Path] | None:
    """The OVMF (code, variables) pair deployed beside a .uefiimg; None for a bare root
    filesystem, which QEMU boots with -kernel."""
    if disk.suffix != ".uefiimg":
        return None
    code, variables = (disk.parent / name for name in OVMF_FILES)
    missing = [str(path) for path in (code, variables) if not path.is_file()]
    if missing:
        raise SmokeTestError(
            f"{disk.name} boots through UEFI firmware, but {', '.join(missing)} is missing: the "
            "qemux86-64 build deploys OVMF beside the image (kas/include/mender-qemu.yml)"
        )
    return code, variables


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (CI cancelling, `kill`) unwinds like Ctrl-C, so finally blocks run."""

    def raise_interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _BootProgress:
    """Says it is still waiting every 30 s, so a slow boot does not look like a hang."""

    def __init__(self) -> None:
        self.next_at = 30.0

    def __call__(self, waited: float) -> None:
        if waited >= self.next_at:
            console.info(f"still waiting for SSH ({waited:.0f} s)")
            self.next_at += 30.0


def print_report(
    results: list[CheckResult],
    boot_seconds: float | None,
    accelerator: qemu.Accelerator | None = None,
) -> None:
    rows = []
    if boot_seconds is not None:
        rows.append(["boot to SSH", "pass", f"{boot_seconds:.1f}", ""])
    for result in results:
        verdict = {True: "pass", False: "FAIL", None: "skip"}[result.passed]
        rows.append([result.name, verdict, f"{result.seconds:.1f}", result.detail.splitlines()[0][:100]])
    console.summary("smoke test report", ["check", "result", "seconds", "detail"], rows)
    if accelerator is not None:
        console.info(f"QEMU accelerator: {accelerator.describe()}")


def run_smoke_test(
    options: SmokeOptions, environ: Mapping[str, str] | None = None, settings: CheckSettings | None = None
) -> list[CheckResult]:
    """Boot (unless --host), run every check, print the report. Raises SmokeTestError
    when anything failed; QEMU is stopped on every path."""
    environ = os.environ if environ is None else environ
    if options.runtime is not None and options.runtime not in RUNTIMES:
        raise SmokeTestUsageError(f"--runtime must be auto, {' or '.join(RUNTIMES)}, got {options.runtime!r}")
    base = settings or CheckSettings(pod_sleep_s=options.pod_sleep_s,
                                     units_timeout_s=options.checks_timeout_s,
                                     node_timeout_s=options.checks_timeout_s,
                                     runtime=options.runtime)
    if options.host:
        expected = options.expected_gpus if options.expected_gpus is not None else 1
        checks = SmokeChecks(SshTarget(options.host, options.ssh_port, options.identity),
                             _with_gpus(base, expected))
        console.step(f"smoke-testing {options.host} over SSH")
        results = checks.run_all()
        print_report(results, None)
        return _verdict(results)

    if options.image:
        check_bootable_in_qemu(options.image)
        rootfs, kernel = options.image, options.kernel or options.image.parent / "bzImage"
    else:
        rootfs, kernel = find_qemu_image(environ)
        kernel = options.kernel or kernel
    if not rootfs.is_file():
        raise SmokeTestError(f"--image {rootfs} does not exist")
    if not kernel.is_file():
        given = "--kernel" if options.kernel else f"the kernel QEMU boots ({kernel.name} beside the image)"
        raise SmokeTestError(f"{given}: {kernel} does not exist; pass --kernel PATH to the qemux86-64 bzImage")
    if options.memory_mib < qemu.MIN_MEMORY_MIB:  # before the probe: bad input is refused at once
        raise SmokeTestUsageError(f"--memory-mib must be at least {qemu.MIN_MEMORY_MIB} (k3s needs it), "
                             f"got {options.memory_mib}")
    firmware = uefi_firmware(rootfs)
    if firmware and options.kernel_args:
        raise SmokeTestUsageError(f"--kernel-args does not apply to {rootfs.name}: GRUB on the disk sets the kernel "
                             "command line (boot the .ext4 with --image to pass arguments)")
    log_dir = options.log_dir or rootfs.parent
    settings_for_qemu = dataclasses.replace(
        _with_gpus(base, options.expected_gpus if options.expected_gpus is not None else 2),
        units=QEMU_AB_UNITS if firmware else QEMU_UNITS,
    )
    with sigterm_as_interrupt():
        if options.kvm is None:
            console.step(f"checking that KVM works (booting {kernel.name} under KVM for at most "
                         f"{options.kvm_probe_timeout_s:.0f} s)")
        accelerator = qemu.choose_accelerator(options.kvm, kernel, probe_timeout_s=options.kvm_probe_timeout_s)
        fell_back = accelerator.chosen_automatically and not accelerator.kvm
        (console.warn if fell_back else console.info)(f"accelerator: {accelerator.describe()}")
        config = qemu.QemuConfig(
            kernel=kernel,
            rootfs=rootfs,
            console_log=log_dir / f"smoke-test-{time.strftime('%Y%m%d-%H%M%S')}.console.log",
            ssh_port=qemu.free_local_port(),
            memory_mib=options.memory_mib,
            kvm=accelerator.kvm,
            initrd=options.initrd,
            # A UEFI disk's GRUB passes the image's kernel arguments itself.
            extra_kernel_args="" if firmware else " ".join(filter(None, (image_kernel_args(rootfs),
                                                                         options.kernel_args))),
            nic_model=options.nic_model,
            firmware=firmware,
        )
        try:
            results, boot_seconds = _boot_and_check(config, options, settings_for_qemu, accelerator)
        except qemu.QemuExited as exited:
            # Raised only for an automatic choice of KVM: the probe passed, yet QEMU died at once.
            accelerator = qemu.Accelerator(
                False, True, f"QEMU under KVM exited after {exited.after_s:.0f} s "
                f"({qemu.exit_description(exited.returncode)}); restarted once without KVM")
            console.warn(f"accelerator: {accelerator.describe()}")
            config = dataclasses.replace(config, kvm=False)
            results, boot_seconds = _boot_and_check(config, options, settings_for_qemu, accelerator)
    print_report(results, boot_seconds, accelerator)
    console.info(f"serial console log: {config.console_log}")
    return _verdict(results)


def _boot_and_check(
    config: qemu.QemuConfig, options: SmokeOptions, settings: CheckSettings, accelerator: qemu.Accelerator
) -> tuple[list[CheckResult], float]:
    """One QEMU run: boot, wait for SSH, run the checks; QEMU is stopped on every path.
    When KVM was chosen automatically, a QEMU that dies early raises QemuExited (retry)."""
    console.step(
        f"booting {config.rootfs.name} in QEMU ({'KVM' if config.kvm else 'TCG: slow software emulation'}, "
        f"{config.memory_mib} MiB, {config.cpus} CPUs, SSH on 127.0.0.1:{config.ssh_port})"
    )
    console.info(f"serial console: {config.console_log}")
    started = time.monotonic()
    with qemu.QemuMachine(config) as machine:
        try:
            boot_seconds = machine.wait_for_ssh(options.boot_timeout_s, on_wait=_BootProgress())
        except qemu.QemuExited as exited:
            if _kvm_died_early(exited, config, accelerator):
                raise
            _fail_boot(exited, config, accelerator, time.monotonic() - started)
        except qemu.QemuError as failure:
            _fail_boot(failure, config, accelerator, time.monotonic() - started)
        console.info(f"SSH is up after {boot_seconds:.1f} s")
        checks = SmokeChecks(SshTarget("root@127.0.0.1", config.ssh_port, options.identity), settings)
        return checks.run_all(), boot_seconds


def _kvm_died_early(exited: qemu.QemuExited, config: qemu.QemuConfig, accelerator: qemu.Accelerator) -> bool:
    """A QEMU error (not a guest power-off: that exits 0) soon after start, under KVM we chose."""
    return (config.kvm and accelerator.chosen_automatically and exited.returncode != 0
            and exited.after_s < qemu.KVM_EARLY_EXIT_S)


def _fail_boot(
    failure: qemu.QemuError, config: qemu.QemuConfig, accelerator: qemu.Accelerator, seconds: float
) -> NoReturn:
    print_report([CheckResult("boot to SSH", False, seconds, str(failure))], None, accelerator)
    raise SmokeTestError(f"{failure}\nnext step: read {config.console_log}") from None


def _with_gpus(settings: CheckSettings, expected: int) -> CheckSettings:
    return dataclasses.replace(settings, expected_gpus=expected)


def _verdict(results: list[CheckResult]) -> list[CheckResult]:
    failed = [r for r in results if r.passed is False]
    if failed:
        raise SmokeTestError(f"{len(failed)} check(s) failed: {failed[0].name}: {failed[0].detail}")
    return results
