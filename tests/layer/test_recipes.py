"""What issue 4 asks of the layer, read from the recipes and the files they install."""

import configparser
import hashlib
import json
import re

import pytest
import yaml
from bbfile import parse, parse_with_requires
from layer_paths import LAYER, REPO

PLUGIN_DIR = LAYER / "recipes-plugin/gpu-device-plugin"
K3S_DIR = LAYER / "recipes-containers/gpu-k8s-k3s-config"
DOCKER_DIR = LAYER / "recipes-containers/gpu-k8s-docker-config"
PRELOAD_DIR = LAYER / "recipes-containers/gpu-k8s-preload-images"
TEGRA = LAYER / "dynamic-layers/tegra"
PLATFORM_CLASS = LAYER / "classes/gpu_k8s_platform.bbclass"


def plugin_recipe():
    found = sorted(PLUGIN_DIR.glob("gpu-device-plugin_*.bb"))
    assert len(found) == 1, f"expected one gpu-device-plugin recipe, found {found}"
    return found[0]


def layer_files(*patterns):
    return sorted(p for pat in patterns for p in LAYER.rglob(pat))


# ---------------------------------------------------------------- layer.conf


def layer_conf_vars():
    text = (LAYER / "conf/layer.conf").read_text().replace("\\\n", " ")
    return dict(re.findall(r'^(\S+)\s*(?:\?\?=|\?=|\+=|=)\s*"([^"]*)"', text, re.M))


def test_layer_serves_three_series_and_does_not_depend_on_meta_tegra():
    conf = layer_conf_vars()
    assert conf["LAYERSERIES_COMPAT_gpu-k8s"].split() == ["kirkstone", "scarthgap", "wrynose"]
    depends = conf["LAYERDEPENDS_gpu-k8s"].split()
    assert {"core", "openembedded-layer", "meta-python", "virtualization-layer"} <= set(depends)
    assert "tegra" not in depends, "x86-64 builds have no meta-tegra: use dynamic-layers, not LAYERDEPENDS"


def test_tegra_content_is_only_reached_through_bbfiles_dynamic():
    conf = layer_conf_vars()
    text = (LAYER / "conf/layer.conf").read_text().replace("\\\n", " ")
    dynamic = [e for v in re.findall(r'^BBFILES_DYNAMIC\s*\+=\s*"([^"]*)"', text, re.M) for e in v.split()]
    # each other layer's content only when that layer is there: tegra, mender for the A/B class,
    # meta-mender-tegra's native scheme for the Orin's A/B pieces (dynamic-layers/mender-tegra)
    folders = {"tegra": "tegra", "mender": "mender", "meta-mender-tegra-native": "mender-tegra"}
    for entry in dynamic:
        collection = entry.split(":", 1)[0]
        assert collection in folders, entry
        assert entry.startswith(f"{collection}:${{LAYERDIR}}/dynamic-layers/{folders[collection]}/"), entry
    assert any(e.startswith("tegra:") for e in dynamic)
    static = conf["BBFILES"].split()
    assert not any("dynamic-layers" in entry for entry in static)
    assert list(TEGRA.rglob("*.bbappend")), "the tegra dynamic layer should hold the linux-tegra append"


def test_no_autorev_or_network_srcrev_in_the_layer():
    for path in layer_files("*.bb", "*.bbappend", "*.inc", "*.conf"):
        text = path.read_text()
        assert "AUTOREV" not in text, f"{path.relative_to(LAYER)} uses AUTOREV"


# ---------------------------------------------------------------- the plugin recipe


def test_plugin_recipe_builds_plugin_dir_of_this_repository():
    path = plugin_recipe()
    bb = parse(path)
    assert "file://plugin" in bb.words("SRC_URI"), "the plugin must come from this repository"
    assert not any(u.startswith(("git://", "http")) for u in bb.words("SRC_URI"))
    extra = bb.value("FILESEXTRAPATHS", "prepend").rstrip(":")
    resolved = (path.parent / extra.replace("${THISDIR}/", "")).resolve()
    assert (resolved / "plugin" / "setup.cfg").exists(), f"FILESEXTRAPATHS {extra} does not reach plugin/"
    assert bb.value("S") == "${UNPACKDIR}/plugin"
    # FILESEXTRAPATHS puts the repository root first in the search path: nothing else in
    # SRC_URI may exist there, or it would shadow the layer's own file.
    shadowed = [u for u in bb.words("SRC_URI") if u != "file://plugin" and (resolved / u[7:]).exists()]
    assert not shadowed, f"repository root shadows {shadowed}"
    assert "python_setuptools_build_meta" in bb.inherits


def test_plugin_recipe_version_and_license_match_the_project():
    path = plugin_recipe()
    setup = configparser.ConfigParser()
    setup.read(REPO / "plugin/setup.cfg")
    version = path.stem.split("_", 1)[1]
    assert version == setup["metadata"]["version"], "recipe PV differs from plugin/setup.cfg version"
    bb = parse(path)
    md5 = re.search(r"file://LICENSE;md5=([0-9a-f]{32})", bb.value("LIC_FILES_CHKSUM")).group(1)
    actual = hashlib.md5((REPO / "plugin/LICENSE").read_bytes()).hexdigest()
    assert md5 == actual, "LIC_FILES_CHKSUM no longer matches plugin/LICENSE"
    assert bb.value("LICENSE") == setup["metadata"]["license"]


def test_plugin_recipe_runtime_depends_on_hpack_and_pyyaml_not_grpcio():
    rdepends = set(parse(plugin_recipe()).words("RDEPENDS", "${PN}"))
    missing = {"python3-hpack", "python3-pyyaml"} - rdepends
    assert not missing, f"plugin RDEPENDS lacks {sorted(missing)}"
    # the plugin serves gRPC with its own code (api/grpc_server.py): grpcio/protobuf are for clients only
    assert not rdepends & {"python3-grpcio", "python3-protobuf"}
    assert not any("nvidia-ml" in d for d in rdepends), "nvidia-ml-py is optional and has no recipe"


def test_plugin_recipe_installs_and_enables_the_unit():
    bb = parse(plugin_recipe())
    assert "systemd" in bb.inherits
    assert bb.value("SYSTEMD_SERVICE", "${PN}") == "gpu-device-plugin.service gpu-dra-driver.service"
    assert bb.values("SYSTEMD_AUTO_ENABLE", "${PN}")[-1].value == "enable"
    install = bb.tasks["do_install:append"]
    assert "${S}/systemd/gpu-device-plugin.service" in install
    assert "${S}/systemd/gpu-dra-driver.service" in install
    assert (REPO / "plugin/systemd/gpu-dra-driver.service").exists()
    # the DeviceClasses go where gpu-k8s-k3s-manifests.service hands them to k3s's auto-deploy
    assert "${S}/deploy/gpu-dra.yaml ${D}${datadir}/gpu-k8s/k3s-manifests/" in install
    assert "${systemd_system_unitdir}" in install
    assert (REPO / "plugin/systemd/gpu-device-plugin.service").exists()
    assert "${sysconfdir}/gpu-device-plugin/config.yaml" in install


@pytest.mark.parametrize(
    ("override_dir", "strategy", "handover"),
    # volume mounts where the runtime ignores NVIDIA_VISIBLE_DEVICES from unprivileged containers
    # (tests/plugin/test_isolation.py); the Nano's runtime reads the variable only
    [("", "auto", "volume-mounts"), ("tegra", "tegra", "volume-mounts"), ("tegra210", "tegra", "envvar"),
     ("qemuall", "simulated", "envvar")],
    ids=["genericx86-64", "jetson", "jetson-nano", "qemu"],
)
def test_default_plugin_config_per_machine(override_dir, strategy, handover):
    conf = yaml.safe_load((PLUGIN_DIR / "files" / override_dir / "gpu-device-plugin.yaml").read_text())
    assert conf["version"] == "v1"
    flags = conf["flags"]
    assert flags["deviceDiscoveryStrategy"] == strategy
    assert flags["plugin"]["deviceListStrategy"] == handover
    if strategy == "simulated":
        assert flags["plugin"]["simulatedGpus"] == 2, "the QEMU smoke test expects nvidia.com/gpu: 2"
    else:
        assert "simulatedGpus" not in flags["plugin"]


# ---------------------------------------------------------------- docker


def daemon_json(override_dir=""):
    return json.loads((DOCKER_DIR / "files" / override_dir / "daemon.json").read_text())


@pytest.mark.parametrize("soc", ["tegra", "tegra234", "tegra264"])
def test_docker_default_runtime_is_nvidia_on_jetson(soc):
    conf = daemon_json(soc)
    assert conf["default-runtime"] == "nvidia"
    assert conf["runtimes"]["nvidia"]["path"] == "/usr/bin/nvidia-container-runtime"


def test_docker_default_runtime_is_untouched_without_nvidia_runtime():
    conf = daemon_json()
    assert "default-runtime" not in conf, "x86-64/QEMU images have no nvidia-container-runtime"


def test_docker_config_pulls_the_package_holding_the_nvidia_runtime_on_jetson():
    bb = parse(DOCKER_DIR / "gpu-k8s-docker-config_1.0.bb")
    assert "gpu_k8s_platform" in bb.inherits
    assert bb.words("RDEPENDS", "${PN}", "append", "tegra") == ["${GPU_K8S_NVIDIA_RUNTIME_PACKAGE}"]
    platform = parse(PLATFORM_CLASS)
    # R32's toolkit 1.0.5 has a separate runtime package; toolkit 1.19 (Orin) ships the binary itself.
    assert platform.value("GPU_K8S_NVIDIA_RUNTIME_PACKAGE", "tegra210") == "nvidia-container-runtime"
    assert platform.value("GPU_K8S_NVIDIA_RUNTIME_PACKAGE", "tegra") == "nvidia-container-toolkit"
    assert platform.value("GPU_K8S_NVIDIA_RUNTIME_PACKAGE") == ""


def test_nvidia_docker_no_longer_ships_a_competing_daemon_json():
    appends = list(TEGRA.rglob("nvidia-docker_*.bbappend"))
    assert appends, "nvidia-docker installs /etc/docker/daemon.json too: needs a bbappend"
    assert "'gpu-k8s', 'gpu_k8s_nvidia_docker'" in appends[0].read_text()
    body = parse(LAYER / "classes/gpu_k8s_nvidia_docker.bbclass").tasks["do_install:append"]
    assert "rm -f ${D}${sysconfdir}/docker/daemon.json" in body


# ---------------------------------------------------------------- k3s (more in test_k3s_*.py)


def test_k3s_role_default_per_machine_and_agent_selectable():
    role_class = parse(LAYER / "classes/gpu_k8s_role.bbclass")
    assert role_class.values("GPU_K8S_K3S_ROLE")[-1].op == "??=", "local.conf must be able to override it"
    assert role_class.value("GPU_K8S_DEFAULT_K3S_ROLE") == "server"
    assert role_class.value("GPU_K8S_DEFAULT_K3S_ROLE", "tegra210") == "agent"
    group = parse(LAYER / "recipes-core/packagegroups/packagegroup-gpu-k8s.bb")
    choose = group.value("GPU_K8S_K3S_PACKAGE")
    assert "'k3s-agent' if" in choose and "'k3s-server'" in choose
    assert "${GPU_K8S_K3S_PACKAGE}" in group.words("RDEPENDS", "${PN}")
    assert "gpu_k8s_role" in group.inherits
    assert "gpu_k8s_role" in parse(K3S_DIR / "gpu-k8s-k3s-config_1.0.bb").inherits


# ---------------------------------------------------------------- packagegroup and images


def test_packagegroup_carries_the_stack():
    group = parse(LAYER / "recipes-core/packagegroups/packagegroup-gpu-k8s.bb")
    rdepends = set(group.words("RDEPENDS", "${PN}"))
    assert {"docker", "gpu-device-plugin", "gpu-k8s-docker-config", "gpu-k8s-k3s-config"} <= rdepends
    tegra = set(group.words("RDEPENDS", "${PN}", "append", "tegra"))
    assert {"${GPU_K8S_NVIDIA_CONTAINER_PACKAGES}", "${GPU_K8S_CUDA_PACKAGES}"} <= tegra
    assert "gpu_k8s_platform" in group.inherits
    platform = parse(PLATFORM_CLASS)
    orin = platform.words("GPU_K8S_NVIDIA_CONTAINER_PACKAGES", "tegra")
    nano = platform.words("GPU_K8S_NVIDIA_CONTAINER_PACKAGES", "tegra210")
    assert set(orin) == {"libnvidia-container-tools", "nvidia-container-toolkit"}  # toolkit 1.19 is the runtime
    assert set(nano) == set(orin) | {"nvidia-container-runtime"}
    # every runtime docker's daemon.json may name is installed
    assert platform.value("GPU_K8S_NVIDIA_RUNTIME_PACKAGE", "tegra") in orin
    assert platform.value("GPU_K8S_NVIDIA_RUNTIME_PACKAGE", "tegra210") in nano
    assert "gpu-k8s-preload-images" in group.words("RDEPENDS", "${PN}", "append", "qemuall")


def image_features(name):
    bb = parse_with_requires(LAYER / f"recipes-core/images/{name}.bb")
    return bb, set(bb.words("IMAGE_FEATURES"))


def test_production_image_has_no_empty_root_password():
    bb, features = image_features("gpu-k8s-image")
    unsafe = {"debug-tweaks", "empty-root-password", "allow-empty-password", "allow-root-login"}
    assert not features & unsafe, f"production image enables {sorted(features & unsafe)}"
    assert "ssh-server-openssh" in features
    assert "packagegroup-gpu-k8s" in bb.words("IMAGE_INSTALL")


def test_dev_image_enables_root_ssh_login_explicitly():
    _, features = image_features("gpu-k8s-image-dev")
    wanted = {"empty-root-password", "allow-empty-password", "allow-root-login", "ssh-server-openssh"}
    assert wanted <= features


def test_image_fstypes_and_qemu_resources():
    bb, _ = image_features("gpu-k8s-image")
    # R32's image type; meta-tegra wrynose (Orin) adds tegraflash-tar.zst itself and has no "tegraflash"
    assert "tegraflash" in bb.words("IMAGE_FSTYPES", "append", "tegra210")
    assert not bb.values("IMAGE_FSTYPES", "append", "tegra")
    assert "ext4" in bb.words("IMAGE_FSTYPES", "append", "qemuall")
    mem = int(re.search(r"-m\s+(\d+)", bb.value("QB_MEM")).group(1))
    assert mem >= 2048, f"k3s needs at least 2 GiB in QEMU, QB_MEM gives {mem} MiB"
    assert int(bb.value("IMAGE_ROOTFS_EXTRA_SPACE", "qemuall")) >= 2 * 1024 * 1024


def test_smoke_container_has_a_shell_and_sleep():
    bb = parse(LAYER / "recipes-containers/gpu-k8s-smoke-container/gpu-k8s-smoke-container.bb")
    assert bb.value("IMAGE_FSTYPES") == "container"
    assert "busybox" in bb.words("IMAGE_INSTALL")
    preload = parse(PRELOAD_DIR / "gpu-k8s-preload-images_1.0.bb")
    assert preload.value("GPU_K8S_CONTAINER_IMAGE") == "gpu-k8s-smoke-container"
    depends = [a.value for a in preload.values("do_install") if a.flag == "[depends]"]
    assert depends == ["${GPU_K8S_CONTAINER_IMAGE}:do_image_complete"]
