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


def test_layer_is_kirkstone_and_does_not_depend_on_meta_tegra():
    conf = layer_conf_vars()
    assert conf["LAYERSERIES_COMPAT_gpu-k8s"].split() == ["kirkstone"]
    depends = conf["LAYERDEPENDS_gpu-k8s"].split()
    assert {"core", "openembedded-layer", "meta-python", "virtualization-layer"} <= set(depends)
    assert "tegra" not in depends, "x86-64 builds have no meta-tegra: use dynamic-layers, not LAYERDEPENDS"


def test_tegra_content_is_only_reached_through_bbfiles_dynamic():
    conf = layer_conf_vars()
    dynamic = conf["BBFILES_DYNAMIC"].split()
    assert all(entry.startswith("tegra:${LAYERDIR}/dynamic-layers/tegra/") for entry in dynamic)
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
    assert bb.value("S") == "${WORKDIR}/plugin"
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


def test_plugin_recipe_runtime_depends_on_grpc_protobuf_and_pyyaml():
    rdepends = set(parse(plugin_recipe()).words("RDEPENDS", "${PN}"))
    missing = {"python3-grpcio", "python3-protobuf", "python3-pyyaml"} - rdepends
    assert not missing, f"plugin RDEPENDS lacks {sorted(missing)}"
    assert not any("nvidia-ml" in d for d in rdepends), "nvidia-ml-py is optional and has no recipe"


def test_plugin_recipe_installs_and_enables_the_unit():
    bb = parse(plugin_recipe())
    assert "systemd" in bb.inherits
    assert bb.value("SYSTEMD_SERVICE", "${PN}") == "gpu-device-plugin.service"
    assert bb.values("SYSTEMD_AUTO_ENABLE", "${PN}")[-1].value == "enable"
    install = bb.tasks["do_install:append"]
    assert "${S}/systemd/gpu-device-plugin.service" in install
    assert "${systemd_system_unitdir}" in install
    assert (REPO / "plugin/systemd/gpu-device-plugin.service").exists()
    assert "${sysconfdir}/gpu-device-plugin/config.yaml" in install


@pytest.mark.parametrize(
    ("override_dir", "strategy"),
    [("", "auto"), ("tegra", "tegra"), ("qemuall", "simulated")],
    ids=["genericx86-64", "jetson", "qemu"],
)
def test_default_plugin_config_per_machine(override_dir, strategy):
    conf = yaml.safe_load((PLUGIN_DIR / "files" / override_dir / "gpu-device-plugin.yaml").read_text())
    assert conf["version"] == "v1"
    flags = conf["flags"]
    assert flags["deviceDiscoveryStrategy"] == strategy
    assert flags["plugin"]["deviceListStrategy"] == "envvar"
    if strategy == "simulated":
        assert flags["plugin"]["simulatedGpus"] == 2, "the QEMU smoke test expects nvidia.com/gpu: 2"
    else:
        assert "simulatedGpus" not in flags["plugin"]


# ---------------------------------------------------------------- docker


def daemon_json(override_dir=""):
    return json.loads((DOCKER_DIR / "files" / override_dir / "daemon.json").read_text())


def test_docker_default_runtime_is_nvidia_on_jetson():
    conf = daemon_json("tegra")
    assert conf["default-runtime"] == "nvidia"
    assert conf["runtimes"]["nvidia"]["path"] == "/usr/bin/nvidia-container-runtime"


def test_docker_default_runtime_is_untouched_without_nvidia_runtime():
    conf = daemon_json()
    assert "default-runtime" not in conf, "x86-64/QEMU images have no nvidia-container-runtime"


def test_docker_config_pulls_the_nvidia_runtime_on_jetson():
    bb = parse(DOCKER_DIR / "gpu-k8s-docker-config_1.0.bb")
    assert "nvidia-container-runtime" in bb.words("RDEPENDS", "${PN}", "append", "tegra")


def test_nvidia_docker_no_longer_ships_a_competing_daemon_json():
    appends = list(TEGRA.rglob("nvidia-docker_*.bbappend"))
    assert appends, "nvidia-docker installs /etc/docker/daemon.json too: needs a bbappend"
    body = parse(appends[0]).tasks["do_install:append"]
    assert "rm -f ${D}${sysconfdir}/docker/daemon.json" in body


def test_docker_and_kubelet_use_the_same_cgroup_driver():
    k3s = yaml.safe_load((K3S_DIR / "files/config.yaml").read_text())
    kubelet = dict(arg.split("=", 1) for arg in k3s["kubelet-arg"])
    for override_dir in ("", "tegra"):
        opts = dict(o.split("=", 1) for o in daemon_json(override_dir)["exec-opts"])
        assert opts["native.cgroupdriver"] == kubelet["cgroup-driver"]


# ---------------------------------------------------------------- k3s


def test_k3s_config_runs_pods_through_docker():
    conf = yaml.safe_load((K3S_DIR / "files/config.yaml").read_text())
    assert conf["docker"] is True


def test_k3s_config_holds_no_token_or_secret():
    credential = re.compile(r"token|secret|^server$|^agent-token$", re.I)
    conf = yaml.safe_load((K3S_DIR / "files/config.yaml").read_text())
    assert not [k for k in conf if credential.search(k)], f"credential keys in config.yaml: {list(conf)}"
    bb = parse(K3S_DIR / "gpu-k8s-k3s-config_1.0.bb")
    written = re.findall(r"printf '([a-z-]+):", bb.tasks["do_install"])
    assert written, "do_install should append keys to config.yaml"
    assert not [k for k in written if credential.search(k)], f"do_install writes credential keys: {written}"
    assert not [a.var for a in bb.assignments if re.search(r"TOKEN|SECRET", a.var)]
    for unit in (K3S_DIR / "files").glob("*.conf"):
        assert not re.search(r"^Environment=.*K3S_(TOKEN|URL)", unit.read_text(), re.M), unit.name


def test_k3s_node_labels_name_the_gpu_per_machine():
    bb = parse(K3S_DIR / "gpu-k8s-k3s-config_1.0.bb")
    for override in ((), ("tegra",), ("tegra210",), ("qemuall",)):
        labels = dict(w.split("=", 1) for w in bb.words("GPU_K8S_DEFAULT_NODE_LABELS", *override))
        assert labels.get("nvidia.com/gpu.present") == "true", f"{override}: gpu.present label"
    nano = dict(w.split("=", 1) for w in bb.words("GPU_K8S_DEFAULT_NODE_LABELS", "tegra210"))
    assert nano["nvidia.com/gpu.family"] == "maxwell"
    assert "node-label" in bb.tasks["do_install"]


def test_k3s_in_qemu_pulls_nothing_from_a_registry():
    bb = parse(K3S_DIR / "gpu-k8s-k3s-config_1.0.bb")
    disabled = set(bb.words("GPU_K8S_DEFAULT_K3S_DISABLE", "qemuall"))
    assert {"traefik", "servicelb", "metrics-server", "local-storage"} <= disabled
    pause = bb.value("GPU_K8S_DEFAULT_PAUSE_IMAGE", "qemuall")
    script = (PRELOAD_DIR / "files/gpu-k8s-preload-images.sh").read_text()
    assert re.search(rf"import_image {re.escape(pause)}\b", script), "pause image is not preloaded"
    assert "import_image localhost/gpu-k8s-smoke:latest" in script
    assert "pause-image" in bb.tasks["do_install"]


def test_k3s_starts_after_docker_and_after_the_preloaded_images():
    dropin = configparser.ConfigParser()
    dropin.read(K3S_DIR / "files/20-gpu-k8s.conf")
    assert "docker.service" in dropin["Unit"]["After"]
    unit = configparser.ConfigParser()
    unit.read(PRELOAD_DIR / "files/gpu-k8s-preload-images.service")
    assert {"k3s.service", "k3s-agent.service"} <= set(unit["Unit"]["Before"].split())
    assert "docker.service" in unit["Unit"]["After"]


def test_k3s_role_is_server_by_default_and_agent_selectable():
    role_class = parse(LAYER / "classes/gpu_k8s_role.bbclass")
    assert role_class.values("GPU_K8S_K3S_ROLE")[-1].value == "server"
    assert role_class.values("GPU_K8S_K3S_ROLE")[-1].op == "??=", "local.conf must be able to override it"
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
    assert {"nvidia-container-runtime", "nvidia-container-toolkit", "libnvidia-container-tools"} <= tegra
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
    assert "tegraflash" in bb.words("IMAGE_FSTYPES", "append", "tegra")
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


# ---------------------------------------------------------------- kernel

REQUIRED_KERNEL_OPTIONS = {
    # netfilter, NAT, xt matches, iptables raw table
    "NETFILTER",
    "NF_CONNTRACK",
    "NF_NAT",
    "IP_NF_IPTABLES",
    "IP_NF_FILTER",
    "IP_NF_NAT",
    "IP_NF_RAW",
    "IP_NF_TARGET_MASQUERADE",
    "NETFILTER_XT_MATCH_ADDRTYPE",
    "NETFILTER_XT_MATCH_CONNTRACK",
    "NETFILTER_XT_MATCH_MULTIPORT",
    "NETFILTER_XT_MATCH_COMMENT",
    "NETFILTER_XT_MARK",
    "NETFILTER_XT_MATCH_STATISTIC",
    "NETFILTER_XT_MATCH_PHYSDEV",
    # bridge netfilter, VXLAN, veth
    "BRIDGE",
    "BRIDGE_NETFILTER",
    "VXLAN",
    "VETH",
    # overlayfs, namespaces, cgroups
    "OVERLAY_FS",
    "NAMESPACES",
    "NET_NS",
    "PID_NS",
    "IPC_NS",
    "UTS_NS",
    "CGROUPS",
    "MEMCG",
    "CPUSETS",
    "CGROUP_DEVICE",
    "CGROUP_PIDS",
    "CGROUP_FREEZER",
    # IPVS, ipset
    "IP_VS",
    "IP_VS_RR",
    "IP_SET",
}


def kernel_fragment():
    options = {}
    fragment = TEGRA / "recipes-kernel/linux/linux-tegra/gpu-k8s-containers.cfg"
    for n, line in enumerate(fragment.read_text().splitlines(), 1):
        m = re.fullmatch(r"CONFIG_([A-Z0-9_]+)=(.+)", line.strip())
        if m:
            assert m.group(1) not in options, f"CONFIG_{m.group(1)} set twice (line {n})"
            options[m.group(1)] = m.group(2)
    return options


def test_kernel_fragment_enables_what_docker_and_k3s_need():
    options = kernel_fragment()
    missing = {o for o in REQUIRED_KERNEL_OPTIONS if options.get(o) not in ("y", "m")}
    assert not missing, f"linux-tegra fragment lacks {sorted(missing)}"


def test_kernel_fragment_is_applied_to_linux_tegra():
    append = TEGRA / "recipes-kernel/linux/linux-tegra_%.bbappend"
    bb = parse(append)
    assert "file://gpu-k8s-containers.cfg" in bb.words("SRC_URI")
    assert bb.value("FILESEXTRAPATHS", "prepend") == "${THISDIR}/linux-tegra:"
