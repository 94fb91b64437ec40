"""smoke-test checks against a stand-in node: ssh runs the command locally, where stand-in
systemctl and kubectl play a one-node k3s cluster with a scheduler that counts GPUs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tools.smoke import smoke_test

SSH = """
import subprocess
options_with_value = {'-o', '-p', '-i', '-l'}
index = 0
while argv[index].startswith('-'):
    index += 2 if argv[index] in options_with_value else 1
destination, command = argv[index], ' '.join(argv[index + 1:])
sys.exit(subprocess.run(['sh', '-c', command], stdin=sys.stdin).returncode)
"""

SYSTEMCTL = """
states = json.load(open(os.path.join(state_dir, 'node.json')))['units']
assert argv[0] == 'is-active'
for unit in argv[1:]:
    print(states.get(unit, 'inactive'))
sys.exit(0 if all(states.get(u) == 'active' for u in argv[1:]) else 3)
"""

# Each kubectl call is one scheduler tick: pods sleeping N seconds run for N ticks.
KUBECTL = """
assert env.get('KUBECONFIG') == '/etc/rancher/k3s/k3s.yaml', 'KUBECONFIG not set for kubectl'
path = os.path.join(state_dir, 'node.json')
node = json.load(open(path))
pods = node['pods']
gpus_free = node['gpus_schedulable'] - sum(1 for p in pods.values() if p['phase'] == 'Running')
for pod in pods.values():
    if pod['phase'] == 'Running':
        pod['ticks'] += 1
        if pod['ticks'] >= pod['sleep']:
            pod['phase'] = 'Succeeded'
            gpus_free += 1
for pod in pods.values():
    if pod['phase'] == 'Pending':
        if gpus_free > 0:
            pod['phase'], pod['ticks'], pod['message'] = 'Running', 0, ''
            gpus_free -= 1
        else:
            pod['message'] = ('0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes '
                              'are available: 1 No preemption victims found for incoming pod.')
out = None
if argv[:2] == ['apply', '-f']:
    manifest = json.load(sys.stdin)
    spec = manifest['spec']['containers'][0]
    assert spec['imagePullPolicy'] == 'Never' and spec['resources']['limits']['nvidia.com/gpu'] == 1
    sleep = int(spec['command'][-1].rsplit(' ', 1)[-1])
    pods[manifest['metadata']['name']] = {'phase': 'Pending', 'sleep': sleep, 'ticks': 0, 'message': ''}
    out = 'pod/' + manifest['metadata']['name'] + ' created'
elif argv[:2] == ['get', 'nodes']:
    out = json.dumps({'items': [{'metadata': {'name': 'qemux86-64'}, 'status': {
        'conditions': [{'type': 'Ready', 'status': 'True'}],
        'nodeInfo': {'containerRuntimeVersion': node.get('runtime_version', '')},
        'capacity': {'nvidia.com/gpu': str(node['gpus_advertised'])},
        'allocatable': {'nvidia.com/gpu': str(node['gpus_advertised'])}}}]})
elif argv[:2] == ['get', 'pods']:
    items = []
    for name, pod in pods.items():
        conditions = []
        if pod['message']:
            conditions.append({'type': 'PodScheduled', 'status': 'False', 'reason': 'Unschedulable',
                               'message': pod['message']})
        items.append({'metadata': {'name': name}, 'status': {'phase': pod['phase'], 'conditions': conditions}})
    out = json.dumps({'items': items})
elif argv[0] == 'logs':
    out = 'GPU-sim-0' if pods[argv[1]]['phase'] in ('Running', 'Succeeded') else ''
elif argv[:2] == ['delete', 'pods']:
    node['pods'] = {}
json.dump(node, open(path, 'w'))
if out is not None:
    print(out)
"""


@pytest.fixture
def node(stand_ins):
    stand_ins.add("ssh", SSH)
    stand_ins.add("systemctl", SYSTEMCTL)
    stand_ins.add("kubectl", KUBECTL)

    def configure(units: dict[str, str] | None = None, advertised: int = 2, schedulable: int | None = None,
                  runtime_version: str = "") -> None:
        state = {
            "units": units or {unit: "active" for unit in smoke_test.UNITS},
            "runtime_version": runtime_version,
            "gpus_advertised": advertised,
            "gpus_schedulable": advertised if schedulable is None else schedulable,
            "pods": {},
        }
        (Path(stand_ins.calls_dir) / "node.json").write_text(json.dumps(state))

    configure()
    return configure


FAST = smoke_test.CheckSettings(
    expected_gpus=2, pod_sleep_s=4, units_timeout_s=0.5, node_timeout_s=0.5, pod_timeout_s=5, poll_s=0.01
)


def run_against_board(settings: smoke_test.CheckSettings = FAST) -> list[smoke_test.CheckResult]:
    options = smoke_test.SmokeOptions(host="root@192.0.2.10", expected_gpus=settings.expected_gpus)
    return smoke_test.run_smoke_test(options, environ={}, settings=settings)


def test_healthy_node_passes_every_check_in_order(node, stand_ins, capsys) -> None:
    results = run_against_board()
    assert [r.passed for r in results] == [True] * 8
    assert "NVIDIA_VISIBLE_DEVICES=GPU-sim-0" in results[4].detail
    assert "Insufficient nvidia.com/gpu" in results[6].detail
    report = capsys.readouterr().out
    assert "smoke test report" in report and "FAIL" not in report
    ssh_argv = stand_ins.calls("ssh")[0]["argv"]
    for option in ("BatchMode=yes", "StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null", "ConnectTimeout=10"):
        assert option in ssh_argv
    assert "root@192.0.2.10" in ssh_argv
    # pods are cleaned up at the end
    assert json.loads((Path(stand_ins.calls_dir) / "node.json").read_text())["pods"] == {}


def test_inactive_plugin_unit_fails_and_skips_the_rest(node, capsys) -> None:
    node(units={"docker": "active", "k3s": "active", "gpu-device-plugin": "failed"})
    with pytest.raises(smoke_test.SmokeTestError, match="gpu-device-plugin failed"):
        run_against_board()
    report = capsys.readouterr().out
    assert "journalctl -b -u" in report
    assert report.count("skip") == 6


def test_wrong_gpu_count_is_reported_with_what_was_seen(node) -> None:
    node(advertised=1)
    with pytest.raises(smoke_test.SmokeTestError, match="allocatable 1, expected 2"):
        run_against_board()


def test_extra_pod_that_runs_instead_of_pending_fails(node) -> None:
    node(advertised=2, schedulable=3)
    with pytest.raises(smoke_test.SmokeTestError, match="gpu-smoke-extra is Running, expected Pending"):
        run_against_board()


def test_real_board_expects_one_gpu_by_default(node) -> None:
    node(advertised=1)
    options = smoke_test.SmokeOptions(host="root@192.0.2.10")
    settings = smoke_test.CheckSettings(
        pod_sleep_s=4, units_timeout_s=0.5, node_timeout_s=0.5, pod_timeout_s=5, poll_s=0.01
    )
    results = smoke_test.run_smoke_test(options, environ={}, settings=settings)
    assert results[3].name == "node advertises nvidia.com/gpu: 1" and results[3].passed


def test_pod_manifest_requests_one_gpu_from_the_shipped_image() -> None:
    pod = json.loads(smoke_test.gpu_pod_manifest("p", 7))
    container = pod["spec"]["containers"][0]
    assert container["image"] == "localhost/gpu-k8s-smoke:latest"
    assert container["imagePullPolicy"] == "Never"
    assert container["resources"]["requests"] == {"nvidia.com/gpu": 1}
    assert container["command"] == ["sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES; sleep 7"]
    assert pod["spec"]["restartPolicy"] == "Never"


def test_unit_states_are_read_in_order_and_missing_ones_are_unknown() -> None:
    assert smoke_test.parse_unit_states("active\nactivating\n") == {
        "docker": "active",
        "k3s": "activating",
        "gpu-device-plugin": "unknown",
    }


# ---------------------------------------------------------------- docker or containerd


def test_runtime_is_read_from_any_k3s_config_file() -> None:
    assert smoke_test.runtime_from_config("# config.yaml\nnode-name: a\n# 10-gpu-k8s-runtime.yaml\ndocker: true\n") \
        == "docker"
    assert smoke_test.runtime_from_config("default-runtime: \"nvidia\"\n# docker: true\n") == "containerd"
    assert smoke_test.runtime_from_config("") == "containerd", "k3s's default"


def test_docker_must_run_only_in_docker_mode() -> None:
    assert smoke_test.units_for_runtime(smoke_test.UNITS, "docker") == smoke_test.UNITS
    assert smoke_test.units_for_runtime(smoke_test.QEMU_UNITS, "containerd") == (
        "k3s", "gpu-device-plugin", "gpu-k8s-preload-images")


@pytest.mark.parametrize(("runtime", "version"), [("docker", "docker://20.10.25"),
                                                  ("containerd", "containerd://2.3.4-k3s1.36")])
def test_both_runtimes_pass_with_what_differs_checked(node, runtime, version) -> None:
    units = {unit: "active" for unit in smoke_test.UNITS}
    if runtime == "containerd":
        units["docker"] = "inactive"  # not needed by k3s's containerd
    node(units=units, runtime_version=version)
    results = run_against_board(dataclasses.replace(FAST, runtime=runtime))
    assert [r.passed for r in results] == [True] * 8
    assert f"runtime {runtime}" in results[1].detail and f"pods through {runtime}" in results[2].detail


def test_docker_mode_needs_docker_running(node) -> None:
    node(units={"docker": "inactive", "k3s": "active", "gpu-device-plugin": "active"})
    with pytest.raises(smoke_test.SmokeTestError, match="docker inactive"):
        run_against_board(dataclasses.replace(FAST, runtime="docker"))


def test_node_on_another_runtime_than_its_config_says_fails(node) -> None:
    node(runtime_version="containerd://2.3.4-k3s1.36")
    with pytest.raises(smoke_test.SmokeTestError, match="runs pods through containerd://.*config says docker"):
        run_against_board(dataclasses.replace(FAST, runtime="docker"))


def test_runtime_is_detected_on_the_node_when_not_given(node, stand_ins, tmp_path, monkeypatch) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("docker: true\n")
    monkeypatch.setattr(smoke_test, "K3S_CONFIG_FILES", str(config))
    node(runtime_version="docker://20.10.25")
    results = run_against_board()
    assert "runtime docker" in results[1].detail
    assert any("cat " + str(config) in " ".join(call["argv"]) for call in stand_ins.calls("ssh"))


def test_unknown_runtime_option_is_refused_before_anything_runs(node, stand_ins) -> None:
    options = smoke_test.SmokeOptions(host="root@192.0.2.10", runtime="cri-o")
    with pytest.raises(smoke_test.SmokeTestError, match="--runtime must be auto, docker or containerd"):
        smoke_test.run_smoke_test(options, environ={})
    assert not stand_ins.calls("ssh")


def test_qemu_gets_the_kernel_arguments_the_image_asks_for(tmp_path) -> None:
    rootfs = tmp_path / "gpu-k8s-image-dev-qemux86-64.rootfs.ext4"
    rootfs.write_bytes(b"")
    assert smoke_test.image_kernel_args(rootfs) == ""
    (tmp_path / "gpu-k8s-image-dev-qemux86-64.qemuboot.conf").write_text(
        "[config_bsp]\nqb_mem = -m 4096\nqb_kernel_cmdline_append =  systemd.unified_cgroup_hierarchy=1\n")
    assert smoke_test.image_kernel_args(rootfs) == "systemd.unified_cgroup_hierarchy=1"
    (tmp_path / "gpu-k8s-image-dev-qemux86-64.qemuboot.conf").write_text("not an ini file\n")
    with pytest.raises(smoke_test.SmokeTestError, match="not a qemuboot.conf"):
        smoke_test.image_kernel_args(rootfs)


def test_an_ab_disk_is_booted_with_the_ovmf_deployed_beside_it(tmp_path: Path) -> None:
    disk = tmp_path / "gpu-k8s-image-dev-qemux86-64.uefiimg"
    disk.write_bytes(b"")
    for name in smoke_test.OVMF_FILES:
        (tmp_path / name).write_bytes(b"")
    assert smoke_test.uefi_firmware(disk) == (tmp_path / "ovmf.code.qcow2", tmp_path / "ovmf.vars.qcow2")
    assert smoke_test.uefi_firmware(tmp_path / "rootfs.ext4") is None, "an ext4 root boots with -kernel"


def test_an_ab_disk_without_its_firmware_is_refused_naming_the_file(tmp_path: Path) -> None:
    disk = tmp_path / "node.uefiimg"
    disk.write_bytes(b"")
    (tmp_path / "ovmf.code.qcow2").write_bytes(b"")
    with pytest.raises(smoke_test.SmokeTestError, match="ovmf.vars.qcow2 is missing"):
        smoke_test.uefi_firmware(disk)


def test_the_ab_image_is_checked_for_its_data_and_fleet_units() -> None:
    assert {"gpu-k8s-data", "gpu-k8s-fleet-images"} <= set(smoke_test.QEMU_AB_UNITS)
    assert set(smoke_test.QEMU_UNITS) <= set(smoke_test.QEMU_AB_UNITS)
