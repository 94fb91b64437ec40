"""What `./task test` does to the host for the QEMU tests: it keeps only the kernel and the
module the tests load, and with --no-host-setup it installs and downloads nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import testdeps


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
