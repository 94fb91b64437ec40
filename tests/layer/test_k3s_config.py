"""The k3s configuration each image installs, rendered by the recipe's own renderer with
the recipe's knobs per machine (issue 12 points 2-3, issue 8 points 3, 4 and 8)."""

from __future__ import annotations

import configparser
import json
import re

import pytest
from bbfile import parse
from k3s_layer import (
    CONFIG_DIR,
    CONFIG_RECIPE,
    MACHINES,
    config_knobs,
    kubelet_args,
    render_for,
    renderer_module,
    resolve,
    run_renderer,
    with_classes,
)
from layer_paths import LAYER
from nvidia_layer import nvidia_default

DOCKER_DIR = LAYER / "recipes-containers/gpu-k8s-docker-config"
# Keys k3s v1.36 accepts in its config files that the renderer may write.
KNOWN_KEYS = {"docker", "kubelet-arg+", "default-runtime", "disable+", "disable-network-policy",
              "pause-image", "node-label+"}
SERVER_ONLY = {"disable+", "disable-network-policy"}


def daemon_json_for(machine: str) -> str:
    """The daemon.json FILESPATH gives the machine: its most specific override directory."""
    for override in reversed(MACHINES[machine]):
        if (DOCKER_DIR / "files" / override / "daemon.json").exists():
            return f"{override}/daemon.json"
    return "daemon.json"


def quantity_mib(text: str) -> float:
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", text).groups()
    return int(number) * (1024 if unit == "Gi" else 1)


@pytest.mark.parametrize("machine", sorted(MACHINES))
@pytest.mark.parametrize("runtime", ["docker", "containerd"])
def test_every_drop_in_is_valid_k3s_config(tmp_path, machine, runtime):
    files = render_for(machine, tmp_path, runtime=runtime)
    assert files, "no drop-in rendered"
    for name, conf in files.items():
        assert re.fullmatch(r"\d\d-gpu-k8s-[a-z-]+\.yaml", name)
        assert set(conf) <= KNOWN_KEYS, f"{name}: unknown keys {set(conf) - KNOWN_KEYS}"
        # Lists are appended ("key+"), so provisioning's own entries in config.yaml survive.
        assert all(key.endswith("+") for key, value in conf.items() if isinstance(value, list))
    assert not (tmp_path / "config.yaml").exists(), "config.yaml is left to provisioning"


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_docker_mode_runs_pods_through_docker_with_dockers_cgroup_driver(tmp_path, machine):
    files = render_for(machine, tmp_path, runtime="docker")
    runtime = files["10-gpu-k8s-runtime.yaml"]
    assert runtime["docker"] is True and "default-runtime" not in runtime
    daemon = daemon_json_for(machine)
    opts = dict(o.split("=", 1) for o in json.loads((DOCKER_DIR / "files" / daemon).read_text())["exec-opts"])
    assert kubelet_args(files)["cgroup-driver"] == opts["native.cgroupdriver"]


def test_cgroup_driver_per_machine_cgroupfs_on_the_nano_systemd_on_orin_thor_and_x86(tmp_path):
    assert kubelet_args(render_for("jetson-nano-devkit", tmp_path / "n"))["cgroup-driver"] == "cgroupfs"
    for machine in ("jetson-orin-nano-devkit-nvme", "jetson-agx-thor-devkit", "genericx86-64", "qemux86-64"):
        assert kubelet_args(render_for(machine, tmp_path / machine))["cgroup-driver"] == "systemd"


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_containerd_mode_leaves_docker_and_the_cgroup_driver_to_k3s(tmp_path, machine):
    files = render_for(machine, tmp_path, runtime="containerd")
    runtime = files["10-gpu-k8s-runtime.yaml"]
    assert "docker" not in runtime
    assert "cgroup-driver" not in kubelet_args(files), "k3s picks containerd's and the kubelet's driver together"
    if "tegra" in MACHINES[machine] or nvidia_default(MACHINES[machine]) == "1":
        assert runtime["default-runtime"] == "nvidia", "GPU pods need no runtimeClassName"
    else:
        assert "default-runtime" not in runtime, "no nvidia-container-runtime on this machine"


@pytest.mark.parametrize("machine", ["jetson-nano-devkit", "jetson-orin-nano-devkit-nvme", "jetson-agx-thor-devkit"])
def test_docker_default_runtime_matches_on_jetson(machine):
    daemon = json.loads((DOCKER_DIR / "files" / daemon_json_for(machine)).read_text())
    assert daemon["default-runtime"] == "nvidia"


def test_nano_kubelet_accepts_cgroup_v1_and_orin_thor_and_x86_do_not_need_to(tmp_path):
    assert kubelet_args(render_for("jetson-nano-devkit", tmp_path / "n"))["fail-cgroupv1"] == "false"
    for machine in ("jetson-orin-nano-devkit-nvme", "jetson-agx-thor-devkit", "genericx86-64", "qemux86-64"):
        assert "fail-cgroupv1" not in kubelet_args(render_for(machine, tmp_path / machine))


def test_x86_images_boot_the_unified_cgroup_hierarchy():
    image = parse(LAYER / "recipes-core/images/gpu-k8s-image.inc")
    for var in ("APPEND", "QB_KERNEL_CMDLINE_APPEND"):
        assert "systemd.unified_cgroup_hierarchy=1" in image.words(var, "append", "x86-64")


def test_nano_kubelet_reserves_memory_and_evicts_before_the_4gb_run_out(tmp_path):
    args = kubelet_args(render_for("jetson-nano-devkit", tmp_path))
    reserved = {}
    for flag in ("system-reserved", "kube-reserved"):
        reserved[flag] = dict(item.split("=") for item in args[flag].split(","))
    hard = dict(re.split(r"<", item) for item in args["eviction-hard"].split(","))
    memory = sum(quantity_mib(r["memory"]) for r in reserved.values()) + quantity_mib(hard["memory.available"])
    assert 512 <= memory <= 0.4 * 4096, f"{memory} MiB held back of 4 GiB"
    assert {"nodefs.available", "imagefs.available"} <= set(hard)
    soft = dict(re.split(r"<", item) for item in args["eviction-soft"].split(","))
    grace = dict(item.split("=") for item in args["eviction-soft-grace-period"].split(","))
    assert set(soft) == set(grace), "every soft threshold needs a grace period"
    assert quantity_mib(soft["memory.available"]) > quantity_mib(hard["memory.available"])
    high, low = int(args["image-gc-high-threshold"]), int(args["image-gc-low-threshold"])
    disk_eviction = 100 - int(hard["imagefs.available"].rstrip("%"))
    assert low < high < disk_eviction, "image GC must run before the disk eviction threshold"


def test_orin_and_x86_keep_k3s_kubelet_defaults(tmp_path):
    for machine in ("jetson-orin-nano-devkit-nvme", "genericx86-64", "qemux86-64"):
        args = kubelet_args(render_for(machine, tmp_path / machine))
        assert not {"system-reserved", "kube-reserved", "eviction-hard"} & set(args)


def test_nano_is_an_agent_by_default_and_a_nano_server_runs_few_add_ons(tmp_path):
    assert config_knobs("jetson-nano-devkit")["role"] == "agent"
    for machine in ("jetson-orin-nano-devkit-nvme", "genericx86-64", "qemux86-64"):
        assert config_knobs(machine)["role"] == "server"
    agent = render_for("jetson-nano-devkit", tmp_path / "agent")
    assert not any(SERVER_ONLY & set(conf) for conf in agent.values()), "server flags in an agent's config"
    server = render_for("jetson-nano-devkit", tmp_path / "server", role="server")["30-gpu-k8s-server.yaml"]
    assert {"traefik", "servicelb", "metrics-server"} <= set(server["disable+"])
    assert not {"coredns", "local-storage"} & set(server["disable+"]), "a Nano server keeps DNS and storage"
    assert server["disable-network-policy"] is True, "kube-router's ipset is unreliable on 4.9"


def test_qemu_pulls_nothing_from_a_registry(tmp_path):
    files = render_for("qemux86-64", tmp_path)
    assert files["40-gpu-k8s-images.yaml"]["pause-image"] == "localhost/gpu-k8s-pause:latest"
    disabled = set(files["30-gpu-k8s-server.yaml"]["disable+"])
    assert {"traefik", "servicelb", "metrics-server", "local-storage"} <= disabled
    script = (LAYER / "recipes-containers/gpu-k8s-preload-images/files/gpu-k8s-preload-images.sh").read_text()
    assert "pause=localhost/gpu-k8s-pause:latest" in script and "import_image \"$pause\"" in script


def test_airgap_images_on_for_qemu_off_for_the_nano_sd_card():
    recipe = parse(CONFIG_RECIPE)
    values = {m: resolve(recipe, "GPU_K8S_K3S_AIRGAP_IMAGES", o) for m, o in MACHINES.items()}
    assert values == {"jetson-nano-devkit": "0", "jetson-orin-nano-devkit-nvme": "0", "jetson-agx-thor-devkit": "0",
                      "genericx86-64": "0", "qemux86-64": "1"}
    assert "${GPU_K8S_AIRGAP_PACKAGE}" in recipe.words("RDEPENDS", "${PN}")
    assert "'k3s-airgap-images' if d.getVar('GPU_K8S_K3S_AIRGAP_IMAGES') == '1' and " \
        "bb.utils.contains('DISTRO_FEATURES', 'gpu-k8s', True, False, d)" in recipe.value("GPU_K8S_AIRGAP_PACKAGE")


def test_no_gpu_labels_are_baked_in(tmp_path):
    for machine in MACHINES:
        for conf in render_for(machine, tmp_path / machine).values():
            labels = conf.get("node-label+", [])
            assert not [label for label in labels if label.startswith("nvidia.com/")], machine
    site = render_for("genericx86-64", tmp_path / "site", **{"node-labels": "site=lab1 rack=3"})
    assert site["50-gpu-k8s-labels.yaml"]["node-label+"] == ["site=lab1", "rack=3"]


def test_every_node_is_labelled_with_the_update_device_type_its_artifacts_name(tmp_path):
    for machine in MACHINES:
        labels = render_for(machine, tmp_path / machine)["55-gpu-k8s-device-type.yaml"]["node-label+"]
        assert labels == [f"update.gpu-k8s.io/device-type={machine}"]
    recipe = parse(CONFIG_RECIPE)
    assert recipe.value("GPU_K8S_UPDATE_DEVICE_TYPE") == "${@d.getVar('MENDER_DEVICE_TYPE') or d.getVar('MACHINE')}"
    orin = render_for("genericx86-64", tmp_path / "orin", **{"device-type": "jetson-orin-nano-devkit-nvme"})
    assert orin["55-gpu-k8s-device-type.yaml"]["node-label+"] == [
        "update.gpu-k8s.io/device-type=jetson-orin-nano-devkit-nvme"]


def test_config_holds_no_token_or_server(tmp_path):
    credential = re.compile(r"token|secret|^server$|agent-token", re.I)
    for machine in MACHINES:
        for conf in render_for(machine, tmp_path / machine).values():
            assert not [key for key in conf if credential.search(key)]
    assert not [a.var for a in parse(CONFIG_RECIPE).assignments if re.search(r"TOKEN|SECRET", a.var)]


@pytest.mark.parametrize(
    ("knob", "value", "named"),
    [("runtime", "cri-o", "runtime"), ("role", "master", "role"), ("cgroup-v1", "maybe", "--cgroup-v1"),
     ("kubelet-profile", "tiny", "kubelet profile"), ("node-labels", "novalue", "node label"),
     ("device-type", "Jetson_Nano", "GPU_K8S_UPDATE_DEVICE_TYPE")],
)
def test_bad_knob_is_one_clear_line_and_writes_nothing(tmp_path, knob, value, named):
    result = run_renderer(tmp_path / "out", config_knobs("jetson-nano-devkit", **{knob: value}))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and value in lines[0]
    assert not (tmp_path / "out").exists()


def test_cgroup_v1_with_the_systemd_driver_is_refused():
    module = renderer_module()
    with pytest.raises(module.ConfigError, match="cgroupfs"):
        module.render(module.Knobs(cgroup_v1=True, cgroup_driver="systemd"))


def test_recipe_validates_runtime_and_airgap_knobs_at_parse_time():
    anonymous = parse(CONFIG_RECIPE).tasks["python"]
    assert "'GPU_K8S_K3S_RUNTIME', ('docker', 'containerd')" in anonymous
    assert "bb.fatal" in anonymous


# ---------------------------------------------------------------- unit drop-ins


def dropin(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    text = (CONFIG_DIR / "files" / name).read_text()
    # systemd allows repeated keys; keep them all, in order
    parser.read_string(re.sub(r"^(ExecStartPre)=", lambda m: f"{m.group(1)}_{next(counter)}=", text, flags=re.M))
    return parser


counter = iter(range(1000))


def test_vendor_drop_ins_go_beside_the_units_not_in_etc():
    install = parse(CONFIG_RECIPE).tasks["do_install"]
    assert "${D}${systemd_system_unitdir}/$unit.service.d" in install
    assert "${sysconfdir}/systemd" not in install
    assert "config.yaml.d" in parse(CONFIG_RECIPE).value("K3S_CONFIG_DIR")
    assert "/config.yaml " not in install and "config.yaml\n" not in install


def test_no_condition_blocks_an_agent_configured_in_its_config_file():
    for name in ("10-gpu-k8s-node.conf", "20-gpu-k8s-docker.conf"):
        assert "ConditionPathExists" not in (CONFIG_DIR / "files" / name).read_text()


def test_node_name_and_gpu_labels_are_derived_at_boot_and_never_stop_k3s():
    conf = dropin("10-gpu-k8s-node.conf")["Service"]
    pre = [value for key, value in conf.items() if key.startswith("ExecStartPre")]
    assert pre[0] == "-@LIBEXECDIR@/gpu-k8s/gpu-k8s-k3s-node-name"
    assert conf["EnvironmentFile"] == "-/run/gpu-k8s/k3s-node.env"
    labels = pre[1].split()
    assert labels[:2] == ["-@BINDIR@/gpu-device-plugin", "node-labels"]
    options = dict(zip(labels[2::2], labels[3::2], strict=True))
    assert options["--config-file"] == "@SYSCONFDIR@/gpu-device-plugin/config.yaml", "the discovery the plugin uses"
    output = options["--output"]
    assert re.fullmatch(r"@SYSCONFDIR@/rancher/k3s/config\.yaml\.d/\d\d-gpu-k8s-gpu-labels\.yaml", output)
    # It sorts after every drop-in the recipe renders, so its node-label+ adds to theirs.
    assert output.rsplit("/", 1)[1] > "50-gpu-k8s-labels.yaml"


def test_docker_ordering_drop_in_only_in_docker_mode():
    conf = dropin("20-gpu-k8s-docker.conf")["Unit"]
    assert conf["After"] == "docker.service" and conf["Wants"] == "docker.service"
    install = parse(CONFIG_RECIPE).tasks["do_install"]
    assert 'if [ "${GPU_K8S_K3S_RUNTIME}" = "docker" ]; then' in install



@pytest.mark.parametrize("machine", ["jetson-orin-nano-devkit-nvme", "jetson-agx-thor-devkit"])
def test_an_orin_or_thor_server_keeps_its_add_ons_and_network_policy(tmp_path, machine):
    files = render_for(machine, tmp_path)
    assert "30-gpu-k8s-server.yaml" not in files, "6.8 has ipset and 8 GB or more: nothing to turn off"


def test_k3s_starts_after_the_unit_that_writes_the_orin_and_thor_runtime_config():
    recipe = with_classes(parse(CONFIG_RECIPE), "gpu_k8s_platform")
    units = {m: resolve(recipe, "GPU_K8S_NVIDIA_SETUP_UNIT", o) for m, o in MACHINES.items()}
    assert units == {"jetson-nano-devkit": "", "jetson-orin-nano-devkit-nvme": "nvidia-container-setup.service",
                     "jetson-agx-thor-devkit": "nvidia-container-setup.service", "genericx86-64": "",
                     "qemux86-64": ""}
    # the ordering, now a requirement, is gpu-k8s-nvidia-runtime-config's (tests/layer/test_jetson_runtime_check.py)
    runtime_config = LAYER / "dynamic-layers/tegra/recipes-containers/gpu-k8s-nvidia-runtime-config"
    dropin = configparser.ConfigParser()
    dropin.read_string((runtime_config / "files/60-gpu-k8s-nvidia-runtime.conf").read_text())
    assert dropin["Unit"]["After"] == dropin["Unit"]["Requires"] == "gpu-k8s-nvidia-runtime-check.service"
    users = parse(runtime_config / "gpu-k8s-nvidia-runtime-config_1.0.bb").words("GPU_K8S_RUNTIME_USERS")
    assert {"k3s.service", "k3s-agent.service"} <= set(users)
