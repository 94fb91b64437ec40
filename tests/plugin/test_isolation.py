"""No pod gets a GPU it did not ask for, under the runtime configuration each image installs.

The configuration is read as the runtime reads it (the file's TOML merged over the defaults
nvidia-ctk itself prints), the plugin answers Allocate with the image's default config, and
toolkit_model says what the runtime then hands the container. A CUDA image sets
NVIDIA_VISIBLE_DEVICES=all: without isolation that alone was every GPU."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import toolkit_model as tm
from fake_nvml import FakeGpu, FakeNvml
from gpu_device_plugin.cdi import toolkit_config, toolkit_spec
from gpu_device_plugin.config import loader
from gpu_device_plugin.config.settings import Settings, TimeSlicing
from gpu_device_plugin.core import policy
from gpu_device_plugin.discovery.nvml import NvmlBackend
from gpu_device_plugin.discovery.tegra import TegraBackend
from gpu_device_plugin.doctor.report import FAIL, PASS, WARN
from gpu_device_plugin.doctor.runtime import evaluate_isolation
from gpu_device_plugin.model import Gpu
from gpu_device_plugin.session.daemon import Daemon
from helpers import RunningDaemon, short_tempdir, wait_until
from kubelet_double import KubeletDouble

REPO = Path(__file__).resolve().parents[2]
LAYER = REPO / "meta-gpu-k8s"
X86_RUNTIME_CONFIG = LAYER / "recipes-containers/nvidia-container-toolkit/files/config.toml"
PLUGIN_FILES = LAYER / "recipes-plugin/gpu-device-plugin/files"
DROP_IN = LAYER / "dynamic-layers/tegra/recipes-containers/gpu-k8s-nvidia-runtime-config/files/50-gpu-k8s-runtime.conf"
DROP_IN_RECIPE = DROP_IN.parent.parent / "gpu-k8s-nvidia-runtime-config_1.0.bb"
FIXTURES = Path(__file__).parent / "fixtures"
ORIN = FIXTURES / "jetson-orin-nano-r39"
NANO = FIXTURES / "jetson-nano"
X86 = FIXTURES / "x86-nvidia-580"
UUIDS = ("GPU-6a3c9e2f-0d4b-4c1e-9a57-1b2c3d4e5f60", "GPU-7b4d0f30-1e5c-4d2f-8b68-2c3d4e5f6071")
# what the x86-64 image shipped before: mode only, every other key the toolkit's default
OLD_X86_CONFIG = '[nvidia-container-runtime]\nmode = "cdi"\n'


def plugin_settings(relative: str, **overrides: Any) -> Settings:
    parsed = loader.parse_file((PLUGIN_FILES / relative).read_text(), source=relative)
    return loader.build({}, {}, parsed)._replace(**overrides)


def x86_gpus() -> list[Gpu]:
    fake = FakeNvml([FakeGpu(UUIDS[0], name="NVIDIA L4", minor=0),
                     FakeGpu(UUIDS[1], name="NVIDIA L4", minor=1, pci_bus_id="00000000:5E:00.0")],
                    driver_version="580.105.08")
    return NvmlBackend(str(X86), fake).discover()


def allocate(gpus: list[Gpu], settings: Settings, ids: list[str]) -> policy.ContainerAllocation:
    devices = {d.id: d for d in policy.advertised_devices(gpus, settings)}
    return policy.allocate(ids, devices, settings)


def gets(c: tm.Container, runtime_config: dict[str, Any], gpus: list[Gpu]) -> set[str]:
    return tm.granted(tm.requested(c, runtime_config), [(g.index, g.id) for g in gpus])


# ---- the configuration, read as the runtime reads it --------------------------------------


def test_the_x86_config_refuses_the_variable_and_accepts_volume_mounts_merged_over_the_defaults() -> None:
    effective = tm.effective_config(X86_RUNTIME_CONFIG.read_text())
    assert effective["accept-nvidia-visible-devices-envvar-when-unprivileged"] is False
    assert effective["accept-nvidia-visible-devices-as-volume-mounts"] is True
    assert effective["nvidia-container-runtime"]["mode"] == "auto"
    # the rest stays the toolkit's: the CDI spec dirs and kind CDI names resolve against
    assert effective["nvidia-container-runtime"]["modes"]["cdi"]["default-kind"] == "nvidia.com/gpu"
    ours = toolkit_config.from_text(X86_RUNTIME_CONFIG.read_text())
    assert ours == toolkit_config.RuntimeConfig(present=True, mode="auto", accept_envvar_unprivileged=False,
                                                accept_volume_mounts=True)
    assert ours.isolates


def test_the_old_x86_config_left_the_variable_accepted_by_the_toolkits_default() -> None:
    effective = tm.effective_config(OLD_X86_CONFIG)
    assert effective["accept-nvidia-visible-devices-envvar-when-unprivileged"] is True
    assert not toolkit_config.from_text(OLD_X86_CONFIG).isolates


def drop_in_sets(isolation: str = "1", mode: str = "csv") -> list[tuple[str, str]]:
    """The drop-in's nvidia-ctk --set pairs, as the recipe writes them for these knobs."""
    recipe = DROP_IN_RECIPE.read_text()
    block = re.search(r'GPU_K8S_RUNTIME_SETTINGS = "(.*?)"\n', recipe, re.S)
    assert block, "the recipe's GPU_K8S_RUNTIME_SETTINGS"
    text = block.group(1).replace("\\\n", " ")
    text = re.sub(r"\$\{@'true' if d\.getVar\('GPU_K8S_GPU_ISOLATION'\) == '0' else 'false'\}",
                  "true" if isolation == "0" else "false", text)
    text = re.sub(r"\$\{@'--set nvidia-container-runtime\.mode=' \+ d\.getVar\('GPU_K8S_NVIDIA_RUNTIME_MODE'\) "
                  r"if d\.getVar\('GPU_K8S_NVIDIA_RUNTIME_MODE'\) else ''\}",
                  f"--set nvidia-container-runtime.mode={mode}" if mode else "", text)
    assert "${" not in text, f"an expression the test does not know: {text}"
    words = shlex.split(text)
    return [tuple(words[i + 1].split("=", 1)) for i in range(0, len(words), 2) if words[i] == "--set"]


def apply_sets(text: str, sets: list[tuple[str, str]]) -> dict[str, Any]:
    """nvidia-ctk config --set on the parsed config: a dotted key names a table path."""
    effective = tm.effective_config(text)
    for key, value in sets:
        *tables, leaf = key.split(".")
        node = effective
        for table in tables:
            node = node.setdefault(table, {})
        node[leaf] = {"true": True, "false": False}.get(value, value)
    return effective


def test_the_orin_drop_in_runs_after_the_setup_unit_wrote_the_config_and_pins_csv() -> None:
    text = DROP_IN.read_text()
    assert text.count("[Service]") == 1
    [command] = re.findall(r"^ExecStartPost=(.*)$", text, re.M)
    assert command.startswith("@BINDIR@/nvidia-ctk config --config-file=/run/nvidia-container-runtime/config.toml "
                              "--in-place @SETTINGS@")
    generated = (FIXTURES / "toolkit/meta-tegra-generated-1.19.1.toml").read_text()
    before = tm.effective_config(generated)
    assert before["nvidia-container-runtime"]["mode"] == "auto"
    assert before["accept-nvidia-visible-devices-envvar-when-unprivileged"] is True
    after = apply_sets(generated, drop_in_sets())
    assert after["nvidia-container-runtime"]["mode"] == "csv"
    assert after["accept-nvidia-visible-devices-envvar-when-unprivileged"] is False
    assert after["accept-nvidia-visible-devices-as-volume-mounts"] is True
    # nvidia-ctk 1.19.1 itself wrote the fixture the Orin tests run on from the same settings
    assert tm.effective_config((ORIN / "etc/nvidia-container-runtime/config.toml").read_text()) == after
    # meta-tegra's alternate root survives
    assert after["nvidia-container-runtime"]["modes"]["csv"]["alt-roots"] == ["/usr/share/nvidia-container-passthrough"]


def test_the_opt_out_and_a_soc_without_a_pinned_mode_change_only_their_own_setting() -> None:
    assert ("accept-nvidia-visible-devices-envvar-when-unprivileged", "true") in drop_in_sets(isolation="0")
    assert [k for k, _ in drop_in_sets(mode="")] == ["accept-nvidia-visible-devices-envvar-when-unprivileged",
                                                     "accept-nvidia-visible-devices-as-volume-mounts"]


@pytest.mark.parametrize("path", [X86_RUNTIME_CONFIG, ORIN / "etc/nvidia-container-runtime/config.toml",
                                  FIXTURES / "toolkit/config-default-1.20.0.toml",
                                  FIXTURES / "toolkit/meta-tegra-generated-1.19.1.toml"])
def test_the_plugins_reader_agrees_with_a_toml_parser(path: Path) -> None:
    text = path.read_text()
    effective = tm.merge({"nvidia-container-runtime": {"mode": "auto"},
                          "accept-nvidia-visible-devices-envvar-when-unprivileged": True,
                          "accept-nvidia-visible-devices-as-volume-mounts": False}, tm.tomllib.loads(text))
    ours = toolkit_config.from_text(text)
    assert (ours.mode, ours.accept_envvar_unprivileged, ours.accept_volume_mounts) == (
        effective["nvidia-container-runtime"]["mode"],
        effective["accept-nvidia-visible-devices-envvar-when-unprivileged"],
        effective["accept-nvidia-visible-devices-as-volume-mounts"])
    tables = toolkit_config.parse_toml(text)
    assert tables[""] == {k: v for k, v in tm.tomllib.loads(text).items() if not isinstance(v, dict)}


def test_a_config_the_runtime_could_not_load_is_reported_not_guessed() -> None:
    broken = toolkit_config.from_text("accept-nvidia-visible-devices-envvar-when-unprivileged = maybe\n")
    assert broken.error and "line 1" in broken.error and not broken.isolates
    wrong_type = toolkit_config.from_text('accept-nvidia-visible-devices-envvar-when-unprivileged = "false"\n')
    assert "must be a TOML bool" in wrong_type.error


# ---- x86-64: the image's runtime config and plugin config together -------------------------


def test_a_pod_that_sets_the_variable_but_requests_no_gpu_gets_no_gpu() -> None:
    runtime = tm.effective_config(X86_RUNTIME_CONFIG.read_text())
    gpus = x86_gpus()
    for pod_env in ({}, {"NVIDIA_VISIBLE_DEVICES": "all"}, {"NVIDIA_VISIBLE_DEVICES": f"{UUIDS[0]},1"}):
        assert gets(tm.container(tm.CUDA_IMAGE_ENV, pod_env), runtime, gpus) == set(), pod_env


def test_the_old_config_gave_that_pod_every_gpu() -> None:
    # the test above, under what the image shipped before: it would have caught the hole
    runtime = tm.effective_config(OLD_X86_CONFIG)
    assert gets(tm.container(tm.CUDA_IMAGE_ENV), runtime, x86_gpus()) == set(UUIDS)


def test_a_pod_that_requests_a_gpu_gets_exactly_its_own() -> None:
    runtime = tm.effective_config(X86_RUNTIME_CONFIG.read_text())
    settings = plugin_settings("gpu-device-plugin.yaml")
    assert settings.device_list_strategy == ("volume-mounts",)
    gpus = x86_gpus()
    for uuid in UUIDS:
        allocation = allocate(gpus, settings, [uuid])
        assert allocation.mounts == [(f"{tm.VOLUME_ROOT}/{uuid}", "/dev/null", True)]
        # the image's NVIDIA_VISIBLE_DEVICES=all and a pod's own value change nothing
        pod = tm.container(tm.CUDA_IMAGE_ENV, {"NVIDIA_VISIBLE_DEVICES": "all"}, allocation)
        assert gets(pod, runtime, gpus) == {uuid}
    both = allocate(gpus, settings, list(UUIDS))
    assert gets(tm.container(tm.CUDA_IMAGE_ENV, allocation=both), runtime, gpus) == set(UUIDS)


def test_time_sliced_replicas_go_to_their_own_physical_gpu() -> None:
    runtime = tm.effective_config(X86_RUNTIME_CONFIG.read_text())
    settings = plugin_settings("gpu-device-plugin.yaml")._replace(time_slicing=TimeSlicing(replicas=2))
    gpus = x86_gpus()
    allocation = allocate(gpus, settings, [f"{UUIDS[1]}::1"])
    assert gets(tm.container(tm.CUDA_IMAGE_ENV, allocation=allocation), runtime, gpus) == {UUIDS[1]}


def test_privileged_pods_keep_the_variable() -> None:
    # the opt-out that stays: CAP_SYS_ADMIN in the bounding set is "privileged" to the toolkit
    runtime = tm.effective_config(X86_RUNTIME_CONFIG.read_text())
    assert gets(tm.container(tm.CUDA_IMAGE_ENV, privileged=True), runtime, x86_gpus()) == set(UUIDS)


def test_a_hostpath_of_dev_null_is_the_one_way_left_to_forge_a_request() -> None:
    # why the docs ask for Pod Security "baseline" on tenant namespaces: it forbids hostPath volumes
    runtime = tm.effective_config(X86_RUNTIME_CONFIG.read_text())
    forged = tm.container(tm.CUDA_IMAGE_ENV, volumes=[("/dev/null", f"{tm.VOLUME_ROOT}/all")])
    assert gets(forged, runtime, x86_gpus()) == set(UUIDS)
    # an emptyDir or any other source is not a request
    other = tm.container(tm.CUDA_IMAGE_ENV, volumes=[("/var/lib/kubelet/pods/x/volumes/e", f"{tm.VOLUME_ROOT}/all")])
    assert gets(other, runtime, x86_gpus()) == set()


def node_root(tmp_path: Path, runtime_text: str | None) -> str:
    """A host root holding the runtime's config.toml (None: none), as the daemon reads it at start."""
    if runtime_text is not None:
        path = tmp_path / "etc/nvidia-container-runtime/config.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(runtime_text)
    return str(tmp_path)


def test_the_daemons_allocate_answers_the_kubelet_with_a_mount_the_runtime_takes(socket_dir: str, tmp_path: Path,
                                                                                 kubelet: KubeletDouble) -> None:
    runtime = tm.effective_config(X86_RUNTIME_CONFIG.read_text())
    gpus = x86_gpus()
    settings = plugin_settings("gpu-device-plugin.yaml", kubelet_socket=f"{socket_dir}/kubelet.sock",
                               device_discovery_strategy="nvml", cdi_spec_dir=socket_dir,
                               host_root=node_root(tmp_path, X86_RUNTIME_CONFIG.read_text()))
    with RunningDaemon(Daemon(settings, gpus, None, environ={})):
        response = kubelet.wait_registered().allocate([UUIDS[1]])
    [answer] = response.container_responses
    mounts = [(m.container_path, m.host_path, m.read_only) for m in answer.mounts]
    assert mounts == [(f"{tm.VOLUME_ROOT}/{UUIDS[1]}", "/dev/null", True)]
    pod = tm.Container({**tm.CUDA_IMAGE_ENV, **dict(answer.envs)}, [(h, c) for c, h, _ in mounts])
    assert gets(pod, runtime, gpus) == {UUIDS[1]}


# ---- Jetson ------------------------------------------------------------------------------------


def orin_gpu() -> Gpu:
    [gpu] = TegraBackend(str(ORIN)).discover()
    return gpu


def test_on_orin_only_the_allocated_pod_gets_the_gpu_in_csv_mode() -> None:
    runtime = tm.effective_config((ORIN / "etc/nvidia-container-runtime/config.toml").read_text())
    assert runtime["nvidia-container-runtime"]["mode"] == "csv"
    settings = plugin_settings("tegra/gpu-device-plugin.yaml")
    assert settings.device_list_strategy == ("volume-mounts",)
    gpu = orin_gpu()
    assert gets(tm.container(tm.CUDA_IMAGE_ENV), runtime, [gpu]) == set()
    allocation = allocate([gpu], settings, [gpu.id])
    assert tm.requested(tm.container(tm.CUDA_IMAGE_ENV, allocation=allocation), runtime) == ["0"]


def test_the_nano_runtime_cannot_refuse_the_variable() -> None:
    # toolkit 1.0.5 reads NVIDIA_VISIBLE_DEVICES from any container and has no setting against it:
    # the plugin keeps envvar there, the only request it reads (docs/layer.md, "GPU isolation")
    settings = plugin_settings("tegra210/gpu-device-plugin.yaml")
    assert settings.device_list_strategy == ("envvar",)
    [gpu] = TegraBackend(str(NANO)).discover()
    assert tm.nano_requested(tm.container({"NVIDIA_VISIBLE_DEVICES": "all"})) == ["all"]
    assert tm.nano_requested(tm.container({"CUDA_VERSION": "10.2.89"})) == ["all"]  # legacy image, variable unset
    assert tm.nano_requested(tm.container({}, allocation=allocate([gpu], settings, [gpu.id]))) == ["0"]


# ---- the plugin's fallback and the check, true for the configured mode -------------------------


def fallback_for(tmp_path: Path, runtime_text: str | None) -> tuple[str, str]:
    if runtime_text is not None:
        path = tmp_path / "etc/nvidia-container-runtime/config.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(runtime_text)
    settings = Settings(device_list_strategy=("cdi-cri",), host_root=str(tmp_path))
    return toolkit_spec.fallback(settings, [UUIDS[0]])


def test_an_unnamed_gpu_falls_back_to_what_the_runtime_resolves_without_a_spec(tmp_path: Path) -> None:
    assert fallback_for(tmp_path / "image", X86_RUNTIME_CONFIG.read_text()) == ("volume-mounts", "")
    assert fallback_for(tmp_path / "none", None) == ("envvar", "")  # the toolkit's defaults
    strategy, why = fallback_for(tmp_path / "cdi", X86_RUNTIME_CONFIG.read_text().replace('"auto"', '"cdi"'))
    assert strategy == "" and "mode is cdi" in why and UUIDS[0] in why and "nvidia-ctk cdi generate" in why
    gpus = x86_gpus()
    settings = Settings(device_list_strategy=("cdi-cri",))
    devices = {d.id: d for d in policy.advertised_devices(gpus, settings)}
    with pytest.raises(policy.AllocationError, match="mode is cdi"):
        policy.allocate([UUIDS[0]], devices, settings, toolkit_name=lambda gpu: None, fallback=(strategy, why))
    via_mounts = policy.allocate([UUIDS[0]], devices, settings, toolkit_name=lambda gpu: None,
                                 fallback=("volume-mounts", ""))
    assert via_mounts.cdi_devices == [] and via_mounts.mounts == [(f"{tm.VOLUME_ROOT}/{UUIDS[0]}", "/dev/null", True)]


def test_the_fallback_message_says_what_the_configured_mode_does() -> None:
    gpu = x86_gpus()[0]
    auto = toolkit_config.unnamed_gpu_handover(toolkit_config.from_text(X86_RUNTIME_CONFIG.read_text()))
    message = toolkit_spec.fallback_message(gpu, "no spec", auto)
    assert "volume-mounts hand-over" in message and "NVIDIA_VISIBLE_DEVICES" not in message
    cdi = toolkit_config.unnamed_gpu_handover(toolkit_config.from_text('[nvidia-container-runtime]\nmode = "cdi"\n'))
    assert "refused at admission" in toolkit_spec.fallback_message(gpu, "no spec", cdi)


@pytest.mark.parametrize(("runtime_text", "strategies", "status", "words"), [
    (X86_RUNTIME_CONFIG.read_text(), ("volume-mounts",), PASS, "volume-mounts hand-over reaches the runtime"),
    (X86_RUNTIME_CONFIG.read_text(), ("envvar",), FAIL, "the plugin refuses to start on it"),
    (OLD_X86_CONFIG, ("envvar",), WARN, "gets every GPU without requesting one"),
    (None, ("volume-mounts",), FAIL, "ignores volume-mount requests (the toolkit's defaults"),
    (None, ("auto",), FAIL, "runs on its defaults"),
    (X86_RUNTIME_CONFIG.read_text(), ("auto",), PASS, "the plugin chose volume-mounts"),
])
def test_the_check_says_whether_a_pod_gets_only_its_gpus(runtime_text: str | None, strategies: tuple[str, ...],
                                                          status: str, words: str) -> None:
    check = evaluate_isolation("nvml", "", toolkit_config.from_text(runtime_text), strategies)
    assert check.status == status and words in check.detail


# ---- the plugin never hands GPUs over by a channel the runtime ignores -------------------------


def test_the_plugin_refuses_to_start_on_a_hand_over_the_runtime_ignores(tmp_path: Path) -> None:
    # the Orin's runtime config ignores NVIDIA_VISIBLE_DEVICES from unprivileged containers: envvar would start
    # every GPU pod without its GPU, so the process exits before it registers anything, naming the fix
    socket_dir = short_tempdir()
    try:
        done = subprocess.run([sys.executable, "-m", "gpu_device_plugin", "--host-root", str(ORIN),
                               "--device-discovery-strategy", "tegra", "--device-list-strategy", "envvar",
                               "--kubelet-socket", f"{socket_dir}/kubelet.sock"],
                              env={**os.environ, "PYTHONPATH": str(REPO / "plugin/src")},
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 2, done.stderr
        assert "deviceListStrategy envvar: the NVIDIA runtime ignores NVIDIA_VISIBLE_DEVICES from unprivileged " \
               "containers" in done.stderr
        assert "leave deviceListStrategy out of the plugin's config" in done.stderr
        assert os.listdir(socket_dir) == [], "nothing was served"
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)


def test_a_reload_to_a_hand_over_the_runtime_ignores_is_rejected_and_the_last_good_one_kept(
        socket_dir: str, tmp_path: Path, kubelet: KubeletDouble) -> None:
    gpus = x86_gpus()
    settings = Settings(kubelet_socket=f"{socket_dir}/kubelet.sock", device_discovery_strategy="nvml",
                        host_root=node_root(tmp_path, X86_RUNTIME_CONFIG.read_text()), cdi_spec_dir=socket_dir)
    loads = [settings._replace(device_list_strategy=("envvar",))]
    daemon = Daemon(settings, gpus, None, reload_settings=lambda: loads[-1], environ={})
    assert daemon.settings.device_list_strategy == ("volume-mounts",), "auto: what this runtime honours"
    with RunningDaemon(daemon):
        endpoint = kubelet.wait_registered()
        daemon.request_reload()
        assert wait_until(lambda: daemon.stats.config_rejections == 1, 10)
        [answer] = endpoint.allocate([UUIDS[0]]).container_responses
    assert daemon.settings.device_list_strategy == ("volume-mounts",)
    assert [m.container_path for m in answer.mounts] == [f"{tm.VOLUME_ROOT}/{UUIDS[0]}"]


# ---- HGX: the toolkit's feature variables (NVIDIA_GDS, _MOFED, _GDRCOPY, _NVSWITCH) -------------

MOFED_IMAGE = {**tm.CUDA_IMAGE_ENV, "NVIDIA_MOFED": "enabled"}  # e.g. an image built for GPUDirect RDMA
HGX_MODE = "jit-cdi"  # what x86-64's "auto" resolves to for the plugin's UUID mounts (internal/info/auto.go)


def test_a_pod_with_a_gpu_and_nvidia_mofed_enabled_gets_no_infiniband_device_on_an_hgx_image() -> None:
    runtime = tm.effective_config(X86_RUNTIME_CONFIG.read_text())
    gpus = x86_gpus()
    allocation = allocate(gpus, plugin_settings("gpu-device-plugin.yaml"), [UUIDS[0]])
    # from the image: the plugin's "disabled" comes later in the environment and wins
    pod = tm.container(MOFED_IMAGE, allocation=allocation)
    assert gets(pod, runtime, gpus) == {UUIDS[0]} and tm.feature_devices(pod, runtime, HGX_MODE) == set()
    # every feature, from the image, at once
    everything = {**tm.CUDA_IMAGE_ENV, **dict.fromkeys(tm.FEATURES, "enabled")}
    assert tm.feature_devices(tm.container(everything, allocation=allocation), runtime, HGX_MODE) == set()
    # after the server's mutating policy: the pod's own env says "disabled", whatever envFrom brought
    admitted = tm.container(MOFED_IMAGE, dict.fromkeys(tm.FEATURES, "disabled"), allocation)
    assert tm.feature_devices(admitted, runtime, HGX_MODE) == set()


def test_what_the_admission_policy_refuses_would_otherwise_get_every_infiniband_device() -> None:
    # the pod's own env beats the plugin's: only the server's validating policy stops a pod that sets
    # NVIDIA_MOFED=enabled itself (conformance/admission refuses it under Kubernetes' own plugins)
    runtime = tm.effective_config(X86_RUNTIME_CONFIG.read_text())
    allocation = allocate(x86_gpus(), plugin_settings("gpu-device-plugin.yaml"), [UUIDS[0]])
    pod = tm.container(tm.CUDA_IMAGE_ENV, {"NVIDIA_MOFED": "enabled"}, allocation)
    assert tm.feature_devices(pod, runtime, HGX_MODE) == {"/dev/infiniband/uverbs*"}


def test_the_plugin_before_this_fix_let_an_image_take_every_feature_device() -> None:
    runtime = tm.effective_config(X86_RUNTIME_CONFIG.read_text())
    allocation = allocate(x86_gpus(), plugin_settings("gpu-device-plugin.yaml"), [UUIDS[0]])
    for name in tm.FEATURES:
        del allocation.envs[name]  # what Allocate answered before: the device list only
    pod = tm.container({**tm.CUDA_IMAGE_ENV, **dict.fromkeys(tm.FEATURES, "enabled")}, allocation=allocation)
    assert tm.feature_devices(pod, runtime, HGX_MODE) == set(tm.FEATURES.values())


def test_a_site_that_opts_in_gives_the_feature_to_every_gpu_pod_of_that_node() -> None:
    runtime = tm.effective_config(X86_RUNTIME_CONFIG.read_text())
    settings = plugin_settings("gpu-device-plugin.yaml", mofed_enabled=True)
    allocation = allocate(x86_gpus(), settings, [UUIDS[0]])
    assert tm.feature_devices(tm.container(tm.CUDA_IMAGE_ENV, allocation=allocation), runtime, HGX_MODE) == {
        "/dev/infiniband/uverbs*"}


def test_a_container_without_a_gpu_or_in_pure_cdi_mode_gets_no_feature_device() -> None:
    runtime = tm.effective_config(X86_RUNTIME_CONFIG.read_text())
    assert tm.feature_devices(tm.container(MOFED_IMAGE, {"NVIDIA_MOFED": "enabled"}), runtime, HGX_MODE) == set()
    allocation = allocate(x86_gpus(), plugin_settings("gpu-device-plugin.yaml"), [UUIDS[0]])
    pod = tm.container(tm.CUDA_IMAGE_ENV, {"NVIDIA_MOFED": "enabled"}, allocation)
    assert tm.feature_devices(pod, runtime, "cdi") == set()


def test_on_orin_and_thor_the_csv_mode_honours_the_feature_variables_too() -> None:
    # the runtimes built from 1.19.1 and 1.20.0 added every /dev/infiniband node to such a container in CSV mode
    runtime = tm.effective_config((ORIN / "etc/nvidia-container-runtime/config.toml").read_text())
    gpu = orin_gpu()
    allocation = allocate([gpu], plugin_settings("tegra/gpu-device-plugin.yaml"), [gpu.id])
    assert tm.feature_devices(tm.container(MOFED_IMAGE, allocation=allocation), runtime) == set()
    old = {k: v for k, v in allocation.envs.items() if k not in tm.FEATURES}
    allocation.envs.clear()
    allocation.envs.update(old)
    assert tm.feature_devices(tm.container(MOFED_IMAGE, allocation=allocation), runtime) == {"/dev/infiniband/uverbs*"}
