"""What `./task test` does to the host for the QEMU tests: it keeps only the kernel and the
module the tests load, and with --no-host-setup it installs and downloads nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.dev import testdeps


def unpacked_kernel_package(root: Path) -> Path:
    """The layout dpkg-deb -x leaves for Debian's linux-image package (shortened)."""
    files = [
        "boot/vmlinuz-6.1.0-56-amd64",
        "boot/System.map-6.1.0-56-amd64",
        "boot/config-6.1.0-56-amd64",
        "lib/modules/6.1.0-56-amd64/kernel/drivers/net/ethernet/intel/e1000/e1000.ko",
        "lib/modules/6.1.0-56-amd64/kernel/drivers/net/ethernet/intel/e1000e/e1000e.ko",
        "lib/modules/6.1.0-56-amd64/kernel/drivers/gpu/drm/i915/i915.ko",
        "lib/modules/6.1.0-56-amd64/modules.order",
        "usr/share/doc/linux-image-6.1.0-56-amd64/changelog.gz",
    ]
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x" * 64)
    return root


def test_only_the_kernel_and_the_tests_module_are_kept(tmp_path: Path) -> None:
    tree = unpacked_kernel_package(tmp_path / "linux-image-6.1.0-56-amd64")
    testdeps.keep_only_what_tests_use(tree)
    kept = sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file())
    assert kept == [
        "boot/vmlinuz-6.1.0-56-amd64",
        "lib/modules/6.1.0-56-amd64/kernel/drivers/net/ethernet/intel/e1000/e1000.ko",
    ]
    assert not (tree / "usr").exists(), "emptied directories go too"


def test_no_host_setup_installs_and_downloads_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("host setup ran despite --no-host-setup")

    monkeypatch.setattr(testdeps, "install_apt_packages", refuse)
    monkeypatch.setattr(testdeps, "prepare_kernel", refuse)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert testdeps.prepare_qemu_test_host(host_setup=False) == {}
    assert "host setup skipped" in capsys.readouterr().out
    cached = tmp_path / "cache" / "meta-gpu-k8s" / "test-kernel" / "linux-image-6.1.0-56-amd64"
    unpacked_kernel_package(cached)
    assert testdeps.prepare_qemu_test_host(host_setup=False) == {testdeps.KERNEL_DIR_VARIABLE: str(cached)}


def test_host_setup_says_what_it_will_do_first(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(testdeps, "install_apt_packages", lambda: "not root")
    assert testdeps.prepare_qemu_test_host() == {}
    out = capsys.readouterr().out
    assert "apt-get" in out and "test-kernel" in out and "--no-host-setup" in out


def test_building_the_plugin_leaves_nothing_untracked() -> None:
    """`pip install ./plugin` makes plugin/build/ (setuptools' build dir) beside the sources."""
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    for path in ("plugin/build/lib/gpu_device_plugin/__init__.py", "plugin/build/bdist.linux-x86_64/x"):
        completed = subprocess.run(["git", "-C", str(repo), "check-ignore", "-q", path], check=False)
        assert completed.returncode == 0, f"{path} would show up as untracked"


# ---------------------------------------------------------------- another apt process

HOLD_LOCK = """
import fcntl, os, sys
descriptor = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o640)
fcntl.lockf(descriptor, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()  # until the test closes stdin
"""
# apt-get as apt 2.6 behaves: `update` fails at once while the lists' lock is held (it does
# not honour DPkg::Lock::Timeout), `install` would wait for the dpkg lock when told to.
APT_GET = """
import fcntl
lock = env["STAND_IN_APT_LOCK"]
if "update" in argv:
    descriptor = os.open(lock, os.O_RDWR)
    try:
        fcntl.lockf(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print(f"E: Could not get lock {lock}. It is held by process 4242 (apt-get)", file=sys.stderr)
        sys.exit(100)
"""


def test_an_apt_process_holding_the_lock_is_waited_for_not_a_reason_to_skip(
        tmp_path: Path, stand_ins, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys
    import threading
    import time

    lock = tmp_path / "lists-lock"
    lock.touch()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    stand_ins.add("apt-get", APT_GET)
    stand_ins.add("dpkg-query", "print('deinstall ok config-files', end='')")
    monkeypatch.setenv("STAND_IN_APT_LOCK", str(lock))
    monkeypatch.setattr(testdeps, "APT_LISTS_LOCK", lock)
    monkeypatch.setattr(testdeps, "LOCK_POLL_S", 0.01)
    monkeypatch.setattr(testdeps.os, "geteuid", lambda: 0)
    result: list[str | None] = []
    worker = threading.Thread(target=lambda: result.append(testdeps.install_apt_packages()))
    worker.start()
    try:
        first_try = stand_ins.calls_dir / "apt-get.calls"
        deadline = time.monotonic() + 60
        while not first_try.exists() and time.monotonic() < deadline:
            worker.join(0.01)  # until apt-get update met the held lock (a condition, not a time)
        assert first_try.exists(), "apt-get update never ran"
        assert worker.is_alive(), "gave up instead of waiting for the other apt process"
    finally:
        holder.stdin.close()  # the other apt process finishes
        holder.wait(timeout=30)
    worker.join(timeout=60)
    assert result == [None], result
    calls = [call["argv"] for call in stand_ins.calls("apt-get")]
    assert [argv for argv in calls if "update" in argv] == [["update", "-qq"], ["update", "-qq"]]
    (install,) = [argv for argv in calls if "install" in argv]
    assert install[:2] == ["-o", f"DPkg::Lock::Timeout={testdeps.APT_LOCK_TIMEOUT_S}"]
    assert install[-len(testdeps.APT_PACKAGES):] == list(testdeps.APT_PACKAGES)


def test_a_leg_whose_qemu_tests_were_skipped_never_reads_pass() -> None:
    from tools.dev import suite

    asked = testdeps.QemuTestSetup({}, "apt-get install qemu-system-x86 failed: E: Could not get lock")
    status, detail = suite.with_qemu_verdict("pass", "", asked)
    assert status == "INCOMPLETE" and suite.LegResult("tools", status, 1.0).failed
    assert "Could not get lock" in detail and "--no-host-setup" in detail
    declined = testdeps.QemuTestSetup({}, "--no-host-setup and no cached test kernel", asked=False)
    status, detail = suite.with_qemu_verdict("pass", "", declined)
    assert status == "PARTIAL" and not suite.LegResult("tools", status, 1.0).failed
    assert detail == "QEMU tests skipped: --no-host-setup and no cached test kernel"
    ran = testdeps.QemuTestSetup({testdeps.KERNEL_DIR_VARIABLE: "/k"})
    assert suite.with_qemu_verdict("pass", "", ran) == ("pass", "")
    assert suite.with_qemu_verdict("FAIL", "pytest exit 1", asked)[0] == "FAIL"
