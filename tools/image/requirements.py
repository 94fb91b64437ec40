"""What a node image must contain, per kind of machine, and why each piece matters.

One list serves both checks: `./task check-image` (the closure bitbake's parse data gives,
before a build) and `./task build` (the manifest of the built image). Pure."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from tools.paths import REPO_ROOT

JETSON = "jetson"
JETSON_ORIN = "jetson-orin"  # with JETSON: a tegra234 (Orin) MACHINE, L4T R39.2 on wrynose
JETSON_THOR = "jetson-thor"  # with JETSON: a tegra264 (Thor) MACHINE, L4T R39.2 on wrynose
X86_64 = "x86-64"
QEMU = "qemu"
NVIDIA = "nvidia"  # the x86-64 discrete-GPU stack (GPU_K8S_NVIDIA = "1")
FABRICMANAGER = "nvidia-fabricmanager"  # with NVIDIA: Fabric Manager pinned (GPU_K8S_NVIDIA_FABRICMANAGER = "1")

# Kernel modules k3s loads that meta-virtualization's k3s does not recommend;
# packagegroup-gpu-k8s recommends the same list (GPU_K8S_KERNEL_MODULES; a test keeps the
# two equal), the layer's k3s recipe a longer one (K3S_KERNEL_REQUIREMENTS below).
K3S_KERNEL_MODULES: dict[str, str] = {
    "br_netfilter": "k3s modprobes it for bridged pod traffic to pass iptables; without it pod -> "
    "ClusterIP traffic on the same node (cluster DNS included) breaks",
    "ip_set": "the k3s network policy controller keeps pod addresses in ipsets; without it "
    "NetworkPolicies fail to apply",
    "ip_set_hash_ip": "the hash:ip ipsets the network policy controller creates",
    "ip_set_hash_net": "the hash:net ipsets the network policy controller creates",
    "xt_set": "iptables' --match-set, how policy rules use those ipsets",
}


# GPU_K8S_CUDA levels and the packages each adds (packagegroup-gpu-k8s.bb has the same
# table; a test keeps them equal). Used when only a built image, not bitbake, is at hand.
CUDA_LEVELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("driver", ("tegra-libraries-cuda",)),
    ("runtime", ("cuda-cudart",)),
    ("libraries", ("cuda-libraries",)),
    ("cudnn", ("cudnn",)),
    ("tensorrt", ("tensorrt-core", "tensorrt-plugins")),
)
DEFAULT_CUDA_LEVEL = "runtime"  # the Nano's (GPU_K8S_DEFAULT_CUDA in classes/gpu_k8s_platform.bbclass)
DEFAULT_CUDA_LEVEL_R39 = "driver"  # Orin, Thor: R39's drivers.csv hands pods libcuda, not the runtime


def cuda_packages(level: str) -> list[str]:
    names = [name for name, _ in CUDA_LEVELS]
    if level not in names:
        raise ValueError(f"unknown GPU_K8S_CUDA level {level!r}; one of {', '.join(names)}")
    return [package for _, packages in CUDA_LEVELS[: names.index(level) + 1] for package in packages]


# The k3s recipe's data list of what k3s needs from the kernel (`x86_64_kernel_modules`:
# module packages for modular kernels); every one is required on x86-64 when it is there.
K3S_KERNEL_REQUIREMENTS = REPO_ROOT / "meta-gpu-k8s/recipes-containers/k3s/k3s-kernel-requirements.yaml"


def k3s_module_packages(path: Path = K3S_KERNEL_REQUIREMENTS) -> list[str]:
    if not path.is_file():
        return []
    data = yaml.safe_load(path.read_text()) or {}
    return [str(name) for name in data.get("x86_64_kernel_modules") or []]


def module_package(module: str) -> str:
    """kernel-module-split's package name: br_netfilter -> kernel-module-br-netfilter."""
    return "kernel-module-" + module.replace("_", "-").lower()


@dataclass(frozen=True)
class Requirement:
    """Any one of `names` satisfies it (a runtime name or one of its providers)."""

    names: tuple[str, ...]
    why: str
    module: str | None = None  # kernel module name: built into the kernel also satisfies it
    title: str | None = None  # how the report names it when names[0] alone would mislead

    @property
    def label(self) -> str:
        return self.title or self.names[0]


def machine_classes(overrides: Collection[str], target_arch: str, nvidia: bool = False,
                    fabricmanager: bool = False) -> list[str]:
    """Which requirement sets apply, from bitbake's MACHINEOVERRIDES and TARGET_ARCH, and
    whether the packagegroup carries the NVIDIA stack (its GPU_K8S_NVIDIA) and Fabric Manager
    (GPU_K8S_NVIDIA_FABRICMANAGER)."""
    classes = []
    if "tegra" in overrides:
        classes.append(JETSON)
    if "tegra234" in overrides:
        classes.append(JETSON_ORIN)
    if "tegra264" in overrides:
        classes.append(JETSON_THOR)
    if target_arch == "x86_64":
        classes.append(X86_64)
    if "qemuall" in overrides:
        classes.append(QEMU)
    if nvidia:
        classes.append(NVIDIA)
        if fabricmanager:
            classes.append(FABRICMANAGER)
    return classes


def _k3s_unit(role: str | None) -> Requirement:
    if role is None:
        return Requirement(("k3s-server", "k3s-agent"), "the k3s systemd unit for the node's role",
                           title="k3s-server or k3s-agent")
    return Requirement((f"k3s-{role}",), f"the k3s {role} unit: the image was asked for as a {role} "
                       f"(--role {role}); without it the node does not take that role")


def _common(role: str | None = None) -> list[Requirement]:
    return [
        Requirement(("docker", "docker-ce", "docker-moby"),
                    "k3s runs every pod through docker (docker: true); without it no pod starts"),
        Requirement(("k3s",), "the Kubernetes node itself"),
        _k3s_unit(role),
        Requirement(("gpu-device-plugin",),
                    "advertises nvidia.com/gpu to the kubelet; without it GPU pods stay Pending"),
        Requirement(("python3-hpack",),
                    "the plugin's gRPC header compression (HPACK); it does not start without it"),
        Requirement(("python3-pyyaml",), "the plugin reads its config file with it"),
        Requirement(("gpu-k8s-docker-config",),
                    "docker's daemon.json: the kubelet's cgroup driver, and nvidia as default runtime on Jetson"),
    ]


def _r39_container_stack() -> list[Requirement]:
    """The container toolkit 1.19 stack of L4T R39 (Orin and Thor): CSV mode with the config its
    unit writes at boot, pinned and made isolating by our drop-in."""
    return [
        Requirement(("nvidia-container-toolkit",),
                    "nvidia-container-runtime (docker's default runtime, k3s's containerd's too), its hook, and the "
                    "unit that writes its CSV-mode config at boot: without it no container starts on the GPU"),
        Requirement(("libnvidia-container-tools",), "nvidia-container-cli, which the runtime's hook runs"),
        Requirement(("tegra-configs-container-csv",),
                    "devices.csv and drivers.csv: which device nodes and host libraries go into a GPU container"),
        Requirement(("tegra-container-passthrough",),
                    "the alternate root meta-tegra's config names (nvidia-ctk cdi generate --mode=csv reads it; "
                    "the runtime's own CSV mode mounts from the rootfs)"),
        Requirement(("gpu-k8s-nvidia-runtime-config",),
                    "the drop-in that pins the runtime to CSV mode and makes it ignore NVIDIA_VISIBLE_DEVICES from "
                    "unprivileged containers: without it any pod that sets the variable gets the GPU, and the mode "
                    "follows NVML's answer (jit-cdi, the discrete-GPU mode, whenever NVML does not start)"),
        Requirement(("nv-tegra-release",),
                    "/etc/nv_tegra_release: the L4T release the plugin labels nodes with and the runtime checks"),
    ]


def _jetson_thor() -> list[Requirement]:
    """Thor (tegra264) on meta-tegra wrynose: the Blackwell iGPU runs on NVIDIA's open kernel
    driver (OpenRM), built out of tree by nvidia-kernel-oot as the unified GPU/display modules
    (NVIDIA_DISPLAY_MODULE_TARGETS "nvidia-gpu-display"); its device nodes are ours to make."""
    return [
        Requirement(("nv-kernel-module-nvidia",),
                    "nvidia.ko, NVIDIA's open kernel driver (OpenRM) that runs Thor's GPU, from nvidia-kernel-oot's "
                    "unified GPU/display build: without it there is no /dev/nvidia*, no /proc/driver/nvidia, "
                    "discovery finds no GPU and GPU pods stay Pending", module="nvidia"),
        Requirement(("nv-kernel-module-nvidia-uvm",),
                    "nvidia-uvm.ko (/dev/nvidia-uvm), CUDA's unified memory driver: no CUDA program starts without "
                    "it (tegra264.inc asks for it through nvidia-kernel-oot-compute)", module="nvidia_uvm"),
        Requirement(("nv-kernel-module-nvidia-drm",),
                    "nvidia-drm.ko, the module meta-tegra loads at boot (nv-load-display-modules: modprobe "
                    "nvidia_drm), which brings nvidia.ko and nvidia-modeset.ko up with it", module="nvidia_drm"),
        Requirement(("nv-kernel-module-nvmap",),
                    "/dev/nvmap, the Tegra memory manager L4T's NvRm libraries under libcuda allocate through "
                    "(tegra264.inc loads it at boot; devices.csv passes it to containers)", module="nvmap"),
        Requirement(("tegra-firmware-tegra264",),
                    "the iGPU's firmware (/lib/firmware/nvidia/gb10b and the driver's GSP firmware in "
                    "/lib/firmware/nvidia/595.78): nvidia.ko does not bring the GPU up without it"),
        Requirement(("tegra-configs-display-driver",),
                    "nv-load-display-modules and its modprobe/depmod configuration: picks the OpenRM modules, "
                    "loads nvidia_drm at boot and writes /run/nvidia-gpu-driver-active (openrm-l4t), which the "
                    "plugin reads to tell Thor's driver from nvgpu"),
        Requirement(("gpu-k8s-nvidia-nodes",),
                    "the boot unit that loads nvidia-uvm and makes /dev/nvidia<N>, /dev/nvidiactl and "
                    "/dev/nvidia-uvm(-tools) before docker, k3s and the plugin: OpenRM makes no nodes itself, and "
                    "CSV mode passes a container only nodes that exist, so without it CUDA in pods finds no GPU"),
        Requirement(("tegra-configs-udev",), "udev rules that give /dev/nvmap, /dev/host1x-fence and the media "
                    "engines' nodes the group and permissions containers need"),
        Requirement(("tegra-libraries-cuda",),
                    "libcuda.so.1 for the OpenRM driver (L4T's openrm variant): containers get it from the host "
                    "(drivers.csv); no CUDA without it"),
        Requirement(("tegra-libraries-nvml",),
                    "libnvidia-ml.so.1 and nvidia-smi for OpenRM: drivers.csv hands them to every GPU container, "
                    "and the toolkit asks NVML which GPUs it has"),
        *_r39_container_stack(),
        *_jetson_r39_updates(),
    ]


def _jetson_orin() -> list[Requirement]:
    """Orin (tegra234) on meta-tegra wrynose: the GPU driver is out of tree (nvidia-kernel-oot)
    and container toolkit 1.19 runs in CSV mode with the config its unit writes at boot."""
    return [
        Requirement(("nv-kernel-module-nvgpu",),
                    "the Orin GPU driver, built out of tree by nvidia-kernel-oot: without it there is no "
                    "/dev/nvgpu/igpu0/*, discovery finds no GPU and GPU pods stay Pending", module="nvgpu"),
        Requirement(("nv-kernel-module-nvmap",),
                    "/dev/nvmap, the memory allocator CUDA and the GPU driver share: no CUDA allocation without it",
                    module="nvmap"),
        Requirement(("nv-kernel-module-host1x",),
                    "host1x syncpoints (/dev/host1x-fence): the GPU's job submission waits on them", module="host1x"),
        Requirement(("tegra-firmware-tegra234",),
                    "the GPU's microcode (/lib/firmware/nvidia/ga10b): nvgpu does not start the GPU without it"),
        Requirement(("tegra-configs-udev",), "udev rules that give /dev/nvgpu/*, /dev/nvmap and /dev/host1x-fence "
                    "the group and permissions containers need"),
        Requirement(("tegra-libraries-cuda",),
                    "libcuda.so.1 for the nvgpu driver: containers get it from the host (CSV mode); no CUDA "
                    "without it"),
        *_r39_container_stack(),
        *_jetson_r39_updates(),
    ]


def _jetson_r39_updates() -> list[Requirement]:
    """A/B updates on the Orin and Thor (meta-mender-tegra's native scheme, docs/layer.md "Jetson
    Orin")."""
    return [
        Requirement(("mender-update",),
                    "the Mender client the update agent drives (`mender-update install|commit|rollback`): "
                    "without it the node takes no update"),
        Requirement(("tegra-rootfs-update-module",),
                    "the tegra-rootfs-image update module (writes the passive slot, stages the boot firmware "
                    "capsule, commits with nvbootctrl) and tegra-rootfs-verify: without it an Orin artifact "
                    "cannot be installed and nothing keeps a committed slot verified"),
        Requirement(("tegra-redundant-boot-base",),
                    "nvbootctrl: the slot queries, the commit (`nvbootctrl verify`) and the rollback's slot switch"),
        Requirement(("tegra-uefi-capsules",),
                    "the boot firmware capsule: applying it is what switches the boot chain to the new slot"),
        Requirement(("gpu-k8s-data",),
                    "binds docker, k3s and the node's identity from /data: without it an update loses the node"),
        Requirement(("gpu-k8s-update",),
                    "the update agent: health gate, commit or rollback, the command rollout jobs run"),
        Requirement(("gpu-k8s-watchdog",),
                    "arms the hardware watchdog, so a new slot that hangs resets and falls back"),
    ]


def _jetson(cuda_packages: Sequence[str], family: str | None = None) -> list[Requirement]:
    """family: JETSON_ORIN or JETSON_THOR for the L4T R39 lists, None for the Nano's (R32)."""
    if family:
        requirements = _jetson_thor() if family == JETSON_THOR else _jetson_orin()
        requirements += [Requirement((package,), "GPU_K8S_CUDA asks for it (CUDA userspace for programs on the host)")
                         for package in cuda_packages if package != "tegra-libraries-cuda"]
        return requirements
    requirements = [
        Requirement(("kernel-module-nvgpu",),
                    "the GPU driver (a module on L4T R32): without it there is no /dev/nvhost-gpu, "
                    "discovery finds no GPU and GPU pods stay Pending", module="nvgpu"),
        Requirement(("tegra-configs-udev",), "udev rules that create the GPU's /dev/nvhost-* and /dev/nvmap "
                    "nodes with the permissions containers need"),
        Requirement(("tegra-libraries-cuda",),
                    "libcuda.so.1: on L4T R32 pods get only the host's libraries, so without it no CUDA in pods"),
        Requirement(("tegra-libraries-cuda-container-csv",),
                    "the CSV that tells the NVIDIA runtime to mount libcuda into containers"),
        Requirement(("nvidia-container-runtime",),
                    "docker's default runtime on Jetson (daemon.json): without it docker starts no container"),
        Requirement(("nvidia-container-toolkit",),
                    "the prestart hook that mounts the GPU device nodes and CSV-listed libraries"),
        Requirement(("libnvidia-container-tools",), "nvidia-container-cli, which the prestart hook runs"),
    ]
    for package in cuda_packages:
        if package == "tegra-libraries-cuda":
            continue
        requirements.append(Requirement((package,), "GPU_K8S_CUDA asks for it (CUDA userspace for pods)"))
    return requirements


def _x86_64(k3s_requirements: Path = K3S_KERNEL_REQUIREMENTS) -> list[Requirement]:
    requirements = [Requirement((module_package(module),), why, module=module)
                    for module, why in K3S_KERNEL_MODULES.items()]
    named = {r.label for r in requirements}
    for package in k3s_module_packages(k3s_requirements):
        if package not in named:
            module = package.removeprefix("kernel-module-").replace("-", "_")
            requirements.append(Requirement((package,), f"k3s loads {module} ({K3S_KERNEL_REQUIREMENTS.name})",
                                            module=module))
    return requirements


# packagegroup-gpu-k8s's GPU_K8S_NVIDIA_PACKAGES (a test keeps the two equal).
NVIDIA_PACKAGES = (
    "gpu-k8s-nvidia-cdi",
    "nvidia-container-toolkit",
    "nvidia-driver-libcuda",
    "nvidia-driver-libnvidia-ml",
    "nvidia-driver-persistenced",
    "nvidia-driver-tools",
    "nvidia-open-gpu-kernel-modules",
    "python3-nvidia-ml-py",
)


def _nvidia() -> list[Requirement]:
    return [
        Requirement(("nvidia-open-gpu-kernel-modules", "kernel-module-nvidia"),
                    "nvidia.ko and nvidia-uvm.ko, NVIDIA's open kernel modules: without them no GPU is driven, "
                    "there is no /dev/nvidia*, NVML finds nothing and GPU pods stay Pending",
                    title="nvidia.ko (nvidia-open-gpu-kernel-modules)"),
        Requirement(("nvidia-driver-firmware",),
                    "the GSP firmware nvidia.ko loads from /lib/firmware/nvidia/<version>/: without it the GPU "
                    "does not initialise"),
        Requirement(("nvidia-driver-libnvidia-ml",),
                    "libnvidia-ml.so.1 (NVML): the plugin discovers GPUs and watches their health through it and "
                    "nvidia-ctk lists GPUs for the CDI spec; without it no GPU is advertised",
                    title="libnvidia-ml (nvidia-driver-libnvidia-ml)"),
        Requirement(("nvidia-driver-libcuda",),
                    "libcuda.so.1, the CUDA driver the CDI spec hands to every GPU container: without it CUDA "
                    "programs in pods find no driver", title="libcuda (nvidia-driver-libcuda)"),
        Requirement(("nvidia-driver-tools",),
                    "nvidia-smi and nvidia-modprobe: the CDI unit initialises the GPUs and creates /dev/nvidia<N> "
                    "and the MIG capability nodes (/dev/nvidia-caps) with them"),
        Requirement(("nvidia-driver-persistenced",),
                    "nvidia-persistenced with libnvidia-cfg.so.1 (which it loads at start) and its unit: without "
                    "it a GPU with no client is torn down and set up again (GSP boot) for every CUDA container"),
        Requirement(("nvidia-container-toolkit",),
                    "nvidia-ctk writes the CDI spec, nvidia-container-runtime (docker's and containerd's default "
                    "runtime) adds the GPUs and driver libraries it names to containers; without it pods get no GPU"),
        Requirement(("gpu-k8s-nvidia-cdi",),
                    "the boot unit that loads the driver, creates /dev/nvidia* and writes /var/run/cdi/nvidia.yaml: "
                    "without the spec GPU containers fail with unresolvable CDI devices"),
        Requirement(("python3-nvidia-ml-py",),
                    "pynvml, which the plugin's NVML discovery imports: without it the plugin finds no discrete GPU"),
    ]


def _qemu() -> list[Requirement]:
    return [
        Requirement(("gpu-k8s-preload-images",),
                    "imports the smoke and pause images: the QEMU node pulls nothing from a registry"),
    ]


def requirements_for(classes: Collection[str], cuda_packages: Sequence[str] = (),
                     k3s_requirements: Path = K3S_KERNEL_REQUIREMENTS, role: str | None = None) -> list[Requirement]:
    """role: the k3s role the image must take (server/agent); None accepts either unit."""
    requirements = _common(role)
    if JETSON in classes:
        family = next((kind for kind in (JETSON_ORIN, JETSON_THOR) if kind in classes), None)
        requirements += _jetson(cuda_packages, family)
    if X86_64 in classes:
        requirements += _x86_64(k3s_requirements)
    if QEMU in classes:
        requirements += _qemu()
    if NVIDIA in classes:
        requirements += _nvidia()
    if FABRICMANAGER in classes:
        requirements.append(Requirement(("nvidia-fabricmanager",),
                                        "Fabric Manager of the driver's version: on NVSwitch systems (HGX/DGX) CUDA "
                                        "fails with 'system not yet initialized' until it has set up the fabric"))
    return requirements


@dataclass(frozen=True)
class Finding:
    requirement: Requirement
    satisfied_by: str | None  # package name, or "built into the kernel"
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.satisfied_by is not None


def evaluate(
    requirements: Sequence[Requirement],
    has: Callable[[str], tuple[str, str] | None],
    builtin_modules: Collection[str] = (),
) -> list[Finding]:
    """`has(name)` -> (package, note) when the image carries `name`, else None."""
    builtin = {name.replace("-", "_") for name in builtin_modules}
    findings = []
    for requirement in requirements:
        found = next((hit for hit in map(has, requirement.names) if hit), None)
        if found:
            findings.append(Finding(requirement, found[0], found[1]))
        elif requirement.module and requirement.module in builtin:
            findings.append(Finding(requirement, "built into the kernel"))
        else:
            findings.append(Finding(requirement, None))
    return findings


def report_lines(findings: Sequence[Finding]) -> list[str]:
    """One line per requirement; missing ones say why they matter."""
    lines = []
    for finding in findings:
        if finding.ok:
            extra = f"  ({finding.note})" if finding.note else ""
            lines.append(f"  ok       {finding.requirement.label}: {finding.satisfied_by}{extra}")
        else:
            lines.append(f"  MISSING  {finding.requirement.label}: {finding.requirement.why}")
    return lines
