"""The NVIDIA container runtime itself, built from the toolkit's source at the tags the images pin, on OCI specs made
from the image's own runtime configuration and the plugin's own Allocate answer.

The runtime is `go install`ed from the Go module proxy (github.com/NVIDIA/nvidia-container-toolkit at v1.20.0,
x86-64's, and v1.19.1, the Orin's and Thor's; meta-tegra's alternate-roots patch is left out, as the cases do not
touch it) once into build/toolkit-runtime/<hash of the Go release and the tag>/, Go's caches in build/go: a cold
build takes minutes, later legs and runs reuse it. Its device root is a directory of character devices made with
mknod: the GPU's nodes and, as on an HGX board with ConnectX cards, /dev/infiniband/uverbs0, uverbs1 and rdma_cm.
On x86-64 the runtime's jit-cdi mode asks NVML for the GPU: a one-GPU libnvidia-ml.so.1
(fixtures/toolkit/one_gpu_nvml.c) compiled against the toolkit's own go-nvml nvml.h stands in for the driver's. The
low-level runtime is a script that keeps the spec the NVIDIA runtime hands it. Skipped where Go, a C compiler, the
module proxy or mknod are not available.

What it shows: a GPU container whose image says NVIDIA_MOFED=enabled gets every InfiniBand node of the host with
the plugin's old answer, none with its answer now (the plugin's "disabled" comes after the image's), all of them
again when the pod's own env says "enabled" (what the server's validating policy refuses), and none after the
mutating policy wrote "disabled" into the pod's env; toolkit_model says the same for every case."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import go_caches
import pytest
import toolkit_model as tm
from fake_nvml import FakeGpu, FakeNvml
from gpu_device_plugin.config import loader
from gpu_device_plugin.core import policy
from gpu_device_plugin.discovery.nvml import NvmlBackend
from gpu_device_plugin.discovery.tegra import TegraBackend
from gpu_device_plugin.model import Gpu

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
BUILD_ROOT = go_caches.BUILD_ROOT
FIXTURES = Path(__file__).parent / "fixtures"
PLUGIN_FILES = REPO / "meta-gpu-k8s/recipes-plugin/gpu-device-plugin/files"
X86_RUNTIME = REPO / "meta-gpu-k8s/recipes-containers/nvidia-container-toolkit/files/config.toml"
ORIN = FIXTURES / "jetson-orin-nano-r39"
TOOLKIT = "github.com/NVIDIA/nvidia-container-toolkit"
UUID = "GPU-6a3c9e2f-0d4b-4c1e-9a57-1b2c3d4e5f60"  # the one GPU the test NVML names
INFINIBAND = {"/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs0", "/dev/infiniband/uverbs1"}
# (path, major, minor) of the device root: the x86-64 GPU's, the Orin's iGPU's (devices.csv), an HCA's
NODES = [("dev/nvidia0", 195, 0), ("dev/nvidiactl", 195, 255), ("dev/nvidia-uvm", 510, 0),
         ("dev/nvidia-uvm-tools", 510, 1), ("dev/nvgpu/igpu0/ctrl", 235, 0), ("dev/nvgpu/igpu0/as", 235, 1),
         ("dev/nvmap", 10, 64), ("dev/host1x-fence", 10, 63), ("dev/infiniband/uverbs0", 231, 192),
         ("dev/infiniband/uverbs1", 231, 193), ("dev/infiniband/rdma_cm", 10, 58)]
DRIVER_LIBRARIES = ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so", "libnvidia-nvvm.so")
FAKE_RUNC = "#!/bin/sh\n# keeps the spec the NVIDIA runtime hands the low-level runtime\n" \
            "while [ $# -gt 0 ]; do [ \"$1\" = --bundle ] && cp \"$2/config.json\" \"$2/handed.json\"; shift; done\n"


BUILD_TIMEOUT_S = 3600  # cold: the toolkit and its dependencies compiled, ~12 min at a load average of 24 on 2 CPUs


def go_env() -> dict[str, str]:
    return go_caches.go_env(CGO_ENABLED="1")


def module_dir(module: str, version: str) -> Path:
    done = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], env=go_env(), capture_output=True,
                          text=True, timeout=BUILD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        pytest.skip(f"{module}@{version} could not be fetched from the Go module proxy: {done.stdout[-300:]}")
    return Path(json.loads(done.stdout)["Dir"])


def built(name: str, key: str, build: Callable[[Path], None]) -> Path:
    """build/toolkit-runtime/<key's hash>/name, made by `build` once: every plugin leg of a test run (and every
    later run) reuses it, so only the first compiles. Written whole or not at all (legs may run at once)."""
    go_version = subprocess.run(["go", "version"], capture_output=True, text=True, check=False).stdout.strip()
    digest = hashlib.sha256(f"{go_version}\n{key}".encode()).hexdigest()[:16]
    out = BUILD_ROOT / "toolkit-runtime" / digest / name
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(f"{name}.{os.getpid()}.partial")
        build(partial)
        partial.replace(out)
    return out


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = [tool for tool in ("go", "gcc") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed: the toolkit is built from source here")
    work = tmp_path_factory.mktemp("toolkit")
    devroot = work / "root"
    try:
        for path, major, minor in NODES:
            (devroot / path).parent.mkdir(parents=True, exist_ok=True)
            os.mknod(devroot / path, 0o600 | 0o020000, os.makedev(major, minor))
    except PermissionError:
        pytest.skip("mknod is not permitted here: the runtime finds devices only as character devices")
    for library in DRIVER_LIBRARIES:  # what the jit-cdi spec mounts; only their presence is checked
        (devroot / "usr/lib/x86_64-linux-gnu").mkdir(parents=True, exist_ok=True)
        (devroot / "usr/lib/x86_64-linux-gnu" / f"{library}.580.126.20").write_bytes(b"")
    (work / "runc").write_text(FAKE_RUNC)
    (work / "runc").chmod(0o755)
    return work


def runtime(version: str) -> Path:
    """nvidia-container-runtime built from the toolkit at `version` (the module proxy, checksums from its go.sum)."""

    def build(out: Path) -> None:
        module_dir(TOOLKIT, version)
        gobin = out.with_name(f"{out.name}.bin")  # go install names the binary after its package
        done = subprocess.run(["go", "install", "-trimpath", f"{TOOLKIT}/cmd/nvidia-container-runtime@{version}"],
                              env={**go_env(), "GOBIN": str(gobin)}, capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        (gobin / "nvidia-container-runtime").replace(out)
        gobin.rmdir()

    return built("nvidia-container-runtime", f"{TOOLKIT}@{version}", build)


def nvml_library() -> Path:
    """The one-GPU NVML, compiled against the nvml.h of the go-nvml the toolkit's v1.20.0 go.mod names."""
    source = FIXTURES / "toolkit/one_gpu_nvml.c"

    def build(out: Path) -> None:
        toolkit = module_dir(TOOLKIT, "v1.20.0")
        [line] = [li for li in (toolkit / "go.mod").read_text().splitlines() if "github.com/NVIDIA/go-nvml " in li]
        nvml = module_dir("github.com/NVIDIA/go-nvml", line.split()[-1])
        done = subprocess.run(["gcc", "-Wall", "-Werror", "-shared", "-fPIC", f"-I{nvml / 'pkg/nvml'}", "-o",
                               str(out), str(source)], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr

    return built("libnvidia-ml.so.1", f"{TOOLKIT}@v1.20.0\n{source.read_text()}", build)


def to_toml(table: dict[str, Any], name: str = "") -> list[str]:
    """TOML for the values config.toml holds (strings, booleans, numbers, lists of them; JSON writes those as
    TOML does), keys before sub-tables."""
    lines = [f"[{name}]"] if name else []
    lines += [f"{key} = {json.dumps(value)}" for key, value in table.items() if not isinstance(value, dict)]
    for key, value in table.items():
        if isinstance(value, dict):
            lines += to_toml(value, f"{name}.{key}" if name else key)
    return lines


def node_config(work: Path, image_config: str, name: str) -> Path:
    """The image's config.toml with only where the runtime looks moved into the test: its device and driver root,
    the low-level runtime, the CSV files and the log."""
    config = tomllib.loads(image_config)
    config.setdefault("nvidia-container-cli", {})["root"] = str(work / "root")
    runtime_table = config.setdefault("nvidia-container-runtime", {})
    runtime_table.update({"runtimes": [str(work / "runc")], "debug": str(work / f"{name}.log"), "log-level": "debug"})
    csv = runtime_table.get("modes", {}).get("csv")
    if csv is not None:
        csv["mount-spec-path"] = str(ORIN / "etc/nvidia-container-runtime/host-files-for-container.d")
        csv.pop("alt-roots", None)  # meta-tegra's patch, not in the upstream tag built here
    path = work / f"{name}.toml"
    path.write_text("\n".join(to_toml(config)) + "\n")
    effective = tm.effective_config(path.read_text())
    assert effective["accept-nvidia-visible-devices-envvar-when-unprivileged"] is False
    assert effective["accept-nvidia-visible-devices-as-volume-mounts"] is True
    return path


def oci_spec(container: tm.Container) -> dict[str, Any]:
    """What the engine writes for the container: its environment in order (image, plugin, pod), its mounts,
    the default capabilities (no CAP_SYS_ADMIN: unprivileged)."""
    env = [f"{k}={v}" for k, v in container.env.items()]
    return {"ociVersion": "1.2.0", "root": {"path": "rootfs"}, "linux": {},
            "process": {"args": ["sh"], "cwd": "/", "env": ["PATH=/usr/bin", *env],
                        "capabilities": {"bounding": ["CAP_CHOWN", "CAP_NET_BIND_SERVICE", "CAP_SETUID"]}},
            "mounts": [{"destination": c, "source": h, "type": "bind", "options": ["bind", "ro"]}
                       for h, c in container.mounts]}


def devices_handed(work: Path, binary: Path, config: Path, container: tm.Container, env: dict[str, str]) -> set[str]:
    bundle = work / "bundle"
    shutil.rmtree(bundle, ignore_errors=True)
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps(oci_spec(container)))
    done = subprocess.run([str(binary), "create", "--bundle", str(bundle), "gpu-pod"], capture_output=True, text=True,
                          env={**env, "NVIDIA_CTK_CONFIG_FILE_PATH": str(config)}, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    handed = json.loads((bundle / "handed.json").read_text())
    return {d["path"] for d in (handed["linux"].get("devices") or [])}


def allocation_for(relative: str, gpu: Gpu, **settings: Any) -> policy.ContainerAllocation:
    parsed = loader.parse_file((PLUGIN_FILES / relative).read_text(), source=relative)
    configured = loader.build({}, {}, parsed)._replace(**settings)
    devices = {d.id: d for d in policy.advertised_devices([gpu], configured)}
    return policy.allocate([gpu.id], devices, configured)


def without_features(allocation: policy.ContainerAllocation) -> policy.ContainerAllocation:
    """What the plugin answered before: the hand-over alone."""
    for name in tm.FEATURES:
        allocation.envs.pop(name, None)
    return allocation


IMAGE = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility", "NVIDIA_MOFED": "enabled"}


def cases(allocation_now: policy.ContainerAllocation, allocation_before: policy.ContainerAllocation
          ) -> list[tuple[str, tm.Container, bool]]:
    """(case, container, gets every InfiniBand node)."""
    return [
        ("the plugin's old answer, an image with NVIDIA_MOFED=enabled",
         tm.container(IMAGE, allocation=allocation_before), True),
        ("the plugin's answer now", tm.container(IMAGE, allocation=allocation_now), False),
        ("the pod's own NVIDIA_MOFED=enabled (the validating policy refuses this pod)",
         tm.container(IMAGE, {"NVIDIA_MOFED": "enabled"}, allocation_now), True),
        ("after the mutating policy", tm.container(IMAGE, dict.fromkeys(tm.FEATURES, "disabled"), allocation_now),
         False),
        ("no GPU allocated", tm.container(IMAGE, {"NVIDIA_MOFED": "enabled"}), False),
    ]


def test_an_hgx_image_gives_a_gpu_pod_no_infiniband_device_on_the_runtime_built_from_1_20_0(work: Path) -> None:
    binary = runtime("v1.20.0")
    env = {**os.environ, "LD_LIBRARY_PATH": str(nvml_library().parent)}
    config = node_config(work, X86_RUNTIME.read_text(), "x86-64")
    [gpu] = NvmlBackend(str(FIXTURES / "x86-nvidia-580"), FakeNvml([FakeGpu(UUID, name="NVIDIA H100 80GB HBM3")])
                        ).discover()
    now = allocation_for("gpu-device-plugin.yaml", gpu)
    before = without_features(allocation_for("gpu-device-plugin.yaml", gpu))
    gpu_nodes = {"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
    for case, container, infiniband in cases(now, before):
        handed = devices_handed(work, binary, config, container, env)
        allocated = bool(container.mounts)
        assert handed == (gpu_nodes if allocated else set()) | (INFINIBAND if infiniband else set()), case
        # the tests' model of the runtime agrees (x86-64's auto is jit-cdi for the plugin's UUID mounts)
        assert bool(tm.feature_devices(container, tm.effective_config(config.read_text()), "jit-cdi")) == infiniband
    assert "Auto-detected mode as 'jit-cdi'" in (work / "x86-64.log").read_text()


def test_the_orin_and_thor_runtime_built_from_1_19_1_does_the_same_in_csv_mode(work: Path) -> None:
    binary = runtime("v1.19.1")
    config = node_config(work, (ORIN / "etc/nvidia-container-runtime/config.toml").read_text(), "orin")
    [gpu] = TegraBackend(str(ORIN)).discover()
    now = allocation_for("tegra/gpu-device-plugin.yaml", gpu)
    before = without_features(allocation_for("tegra/gpu-device-plugin.yaml", gpu))
    for case, container, infiniband in cases(now, before):
        handed = devices_handed(work, binary, config, container, dict(os.environ))
        assert ("/dev/nvgpu/igpu0/ctrl" in handed) == bool(container.mounts), case
        assert (handed & INFINIBAND) == (INFINIBAND if infiniband else set()), case
        assert bool(tm.feature_devices(container, tm.effective_config(config.read_text()))) == infiniband
