"""Device nodes are looked up at each Allocate: nvidia-uvm appears only on the first CUDA use."""

from __future__ import annotations

from pathlib import Path

from gpu_device_plugin.config.settings import Settings
from gpu_device_plugin.core import policy
from gpu_device_plugin.model import Gpu
from gpu_device_plugin.session.daemon import Daemon
from helpers import RunningDaemon, simulated_settings
from kubelet_double import KubeletDouble

GPU = Gpu(id="GPU-0f0e", index=0, name="Tesla T4", backend="nvml", device_nodes=("/dev/nvidia0", "/dev/nvidiactl"),
          optional_nodes=("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"))


def test_only_nodes_that_exist_are_passed() -> None:
    devices = {d.id: d for d in policy.advertised_devices([GPU], Settings())}
    present = {"/dev/nvidiactl", "/dev/nvidia-uvm"}
    result = policy.allocate([GPU.id], devices, Settings()._replace(pass_device_specs=True), present.__contains__)
    assert result.device_specs == [("/dev/nvidiactl", "/dev/nvidiactl", "rw"),
                                   ("/dev/nvidia-uvm", "/dev/nvidia-uvm", "rw")]


def test_a_node_created_after_start_is_passed_by_the_next_allocate(socket_dir: str, kubelet: KubeletDouble,
                                                                   tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    for name in ("nvidia0", "nvidiactl"):
        (tmp_path / "dev" / name).write_text("")
    settings = simulated_settings(socket_dir, pass_device_specs=True, host_root=str(tmp_path))
    with RunningDaemon(Daemon(settings, [GPU], None, environ={})):
        endpoint = kubelet.wait_registered()
        before = endpoint.allocate([GPU.id]).container_responses[0]
        (tmp_path / "dev" / "nvidia-uvm").write_text("")  # the first CUDA program loaded nvidia-uvm
        after = endpoint.allocate([GPU.id]).container_responses[0]
    assert [d.host_path for d in before.devices] == ["/dev/nvidia0", "/dev/nvidiactl"]
    assert [d.host_path for d in after.devices] == ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    assert [d.container_path for d in after.devices] == ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"]
