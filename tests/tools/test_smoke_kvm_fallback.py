"""smoke-test picks KVM only when it works: a stand-in QEMU that aborts under KVM (as QEMU
does under a broken nested KVM) and otherwise plays a guest that offers SSH on the
forwarded port. The whole task path runs, checks included, against the stand-in node."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_qemu_command import CRASHES_UNDER_KVM, RECORD_PID, SERIAL_FILE
from test_smoke_checks import KUBECTL, SSH, SYSTEMCTL

from tools.smoke import qemu, smoke_test

# A guest whose SSH server answers on the forwarded port until QEMU is stopped.
GUEST = SERIAL_FILE + """
import socket
port = int(next(a for a in argv if 'hostfwd=' in a).split('127.0.0.1:')[1].split('-')[0])
open(serial, 'w').write('stand-in guest booted\\n')
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(('127.0.0.1', port))
server.listen(5)
while True:
    connection, _ = server.accept()
    connection.sendall(b'SSH-2.0-stand-in\\r\\n')
    connection.close()
"""
PROBE_PASSES = """
if '-name' in argv and argv[argv.index('-name') + 1] == 'gpu-k8s-kvm-probe':
    serial = next(a for a in argv if a.startswith('file:'))[len('file:'):]
    open(serial, 'w').write('Kernel panic - not syncing: VFS: Unable to mount root fs\\n')
    sys.exit(0)
"""


@pytest.fixture
def image(tmp_path: Path, stand_ins, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An image and kernel, a usable-looking /dev/kvm, and the stand-in node behind ssh."""
    monkeypatch.setattr(qemu, "kvm_usable", lambda device=None: True)
    stand_ins.add("ssh", SSH)
    stand_ins.add("systemctl", SYSTEMCTL)
    stand_ins.add("kubectl", KUBECTL)
    state = {"units": {u: "active" for u in smoke_test.QEMU_UNITS}, "gpus_advertised": 2, "gpus_schedulable": 2,
             "pods": {}}
    (stand_ins.calls_dir / "node.json").write_text(json.dumps(state))
    rootfs = tmp_path / "gpu-k8s-image-dev-qemux86-64.ext4"
    rootfs.write_bytes(b"rootfs")
    (tmp_path / "bzImage").write_bytes(b"kernel")
    return rootfs


FAST = smoke_test.CheckSettings(pod_sleep_s=4, units_timeout_s=1, node_timeout_s=1, pod_timeout_s=5, poll_s=0.01)


def run(image: Path, kvm: bool | None = None) -> list[smoke_test.CheckResult]:
    options = smoke_test.SmokeOptions(image=image, kvm=kvm, boot_timeout_s=20, log_dir=image.parent)
    return smoke_test.run_smoke_test(options, environ={}, settings=FAST)


def accelerators(stand_ins) -> list[str]:
    return [call["argv"][call["argv"].index("-accel") + 1] for call in stand_ins.calls("qemu-system-x86_64")]


def assert_no_qemu_left(stand_ins) -> None:
    pid = int((stand_ins.calls_dir / "qemu.pid").read_text())
    assert not os.path.exists(f"/proc/{pid}"), f"QEMU (pid {pid}) is still running"


def test_kvm_that_aborts_qemu_falls_back_to_tcg_after_the_probe(image, stand_ins, capsys) -> None:
    stand_ins.add("qemu-system-x86_64", CRASHES_UNDER_KVM + GUEST)
    results = run(image)
    assert all(r.passed for r in results)
    assert accelerators(stand_ins) == ["kvm", "tcg"], "one probe under KVM, then the boot under TCG"
    assert "gpu-k8s-kvm-probe" in stand_ins.calls("qemu-system-x86_64")[0]["argv"]
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if line.startswith("warning: accelerator:")]
    assert warnings == [
        "warning: accelerator: TCG (software emulation, slow): KVM probe failed: QEMU exited with signal "
        "SIGABRT: qemu-system-x86_64: error: failed to set MSR 0x10a to 0x69 (--kvm forces KVM)"
    ]
    assert "QEMU accelerator: TCG" in out.split("smoke test report")[1], "the report names the accelerator"
    assert_no_qemu_left(stand_ins)


def test_qemu_dying_under_kvm_after_a_good_probe_restarts_once_under_tcg(image, stand_ins, capsys) -> None:
    stand_ins.add("qemu-system-x86_64", PROBE_PASSES + CRASHES_UNDER_KVM + GUEST)
    results = run(image)
    assert all(r.passed for r in results)
    assert accelerators(stand_ins) == ["kvm", "kvm", "tcg"], "probe, boot under KVM, one restart under TCG"
    out = capsys.readouterr().out
    assert "accelerator: KVM: KVM probe passed" in out
    assert "restarted once without KVM" in out
    assert "QEMU accelerator: TCG" in out.split("smoke test report")[1]
    assert_no_qemu_left(stand_ins)


def test_working_kvm_is_used_and_reported(image, stand_ins, capsys) -> None:
    stand_ins.add("qemu-system-x86_64", RECORD_PID + PROBE_PASSES + GUEST)
    run(image)
    assert accelerators(stand_ins) == ["kvm", "kvm"]
    assert "QEMU accelerator: KVM: KVM probe passed" in capsys.readouterr().out
    assert_no_qemu_left(stand_ins)


def test_forced_kvm_is_not_probed_and_not_replaced(image, stand_ins, capsys) -> None:
    stand_ins.add("qemu-system-x86_64", CRASHES_UNDER_KVM + GUEST)
    with pytest.raises(smoke_test.SmokeTestError, match="QEMU exited with signal SIGABRT before SSH came up"):
        run(image, kvm=True)
    assert accelerators(stand_ins) == ["kvm"]
    assert "QEMU accelerator: KVM: forced with --kvm" in capsys.readouterr().out


def test_no_kvm_boots_under_tcg_without_a_probe(image, stand_ins) -> None:
    stand_ins.add("qemu-system-x86_64", CRASHES_UNDER_KVM + GUEST)
    run(image, kvm=False)
    assert accelerators(stand_ins) == ["tcg"]


def test_qemu_image_whose_container_images_were_not_imported_fails_early(image, stand_ins) -> None:
    stand_ins.add("qemu-system-x86_64", GUEST)
    units = {u: "active" for u in smoke_test.QEMU_UNITS} | {"gpu-k8s-preload-images": "failed"}
    node = json.loads((stand_ins.calls_dir / "node.json").read_text())
    (stand_ins.calls_dir / "node.json").write_text(json.dumps(node | {"units": units}))
    with pytest.raises(smoke_test.SmokeTestError, match="gpu-k8s-preload-images failed"):
        run(image, kvm=False)


def test_too_little_memory_is_refused_before_any_qemu_runs(image, stand_ins) -> None:
    stand_ins.add("qemu-system-x86_64", CRASHES_UNDER_KVM + GUEST)
    options = smoke_test.SmokeOptions(image=image, memory_mib=1024)
    with pytest.raises(smoke_test.SmokeTestError, match="--memory-mib must be at least 2048"):
        smoke_test.run_smoke_test(options, environ={}, settings=FAST)
    assert stand_ins.calls("qemu-system-x86_64") == []


def test_a_board_image_is_refused_for_what_it_is_not_for_a_kernel_never_asked_for(tmp_path, stand_ins) -> None:
    stand_ins.add("qemu-system-x86_64", CRASHES_UNDER_KVM + GUEST)
    sdcard = tmp_path / "gpu-k8s-image-jetson-nano-devkit.sdcard"
    sdcard.write_bytes(b"card")
    with pytest.raises(smoke_test.SmokeTestError) as refused:
        smoke_test.run_smoke_test(smoke_test.SmokeOptions(image=sdcard), environ={}, settings=FAST)
    message = str(refused.value)
    assert "--kernel" not in message and "\n" not in message
    assert "--host" in message and "./task flash" in message
    assert stand_ins.calls("qemu-system-x86_64") == []


def test_a_missing_kernel_beside_the_image_says_where_it_looked(tmp_path, stand_ins) -> None:
    rootfs = tmp_path / "gpu-k8s-image-qemux86-64.ext4"
    rootfs.write_bytes(b"rootfs")
    with pytest.raises(smoke_test.SmokeTestError, match="bzImage beside the image.*pass --kernel PATH"):
        smoke_test.run_smoke_test(smoke_test.SmokeOptions(image=rootfs), environ={}, settings=FAST)
