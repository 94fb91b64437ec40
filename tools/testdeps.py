"""What the QEMU tests in tests/tools need from the host, installed from Debian's packages.

`./task test` calls `prepare_qemu_test_host` before pytest: it installs qemu-system-x86 and
busybox-static with apt-get (as root, when missing) and unpacks a Debian kernel package into
the user cache (apt-get download + dpkg-deb -x: no postinst, nothing changes in /boot),
keeping only the kernel and the one module the tests load (a few MB, not the package's
~400 MB). It says so before doing it; `./task test --no-host-setup` (or
GPU_K8S_TEST_NO_HOST_SETUP=1) changes nothing on the host. When the QEMU tests cannot run,
they skip and say why (KERNEL_DIR_VARIABLE unset)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tools import console
from tools.paths import user_cache_dir

KERNEL_DIR_VARIABLE = "GPU_K8S_TEST_KERNEL_DIR"
APT_PACKAGES = ("qemu-system-x86", "busybox-static")
KERNEL_METAPACKAGE = "linux-image-amd64"
# What the QEMU tests use of the kernel package: the kernel and the guest's NIC driver
# (tests/tools/test_qemu_boot.py). The rest (~400 MB of modules) is not kept.
TEST_KERNEL_MODULES = ("e1000",)


def package_installed(package: str) -> bool:
    completed = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, check=False
    )
    return completed.returncode == 0 and "install ok installed" in completed.stdout


def _quiet(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)


def install_apt_packages() -> str | None:
    """None when the packages are there; otherwise why they are not."""
    if shutil.which("dpkg-query") is None:
        return "not a Debian/Ubuntu host (no dpkg-query): install qemu-system-x86_64 and a static busybox"
    missing = [p for p in APT_PACKAGES if not package_installed(p)]
    if not missing:
        return None
    if os.geteuid() != 0:
        return f"missing {' '.join(missing)} and not root: sudo apt-get install {' '.join(missing)}"
    console.info(f"installing {' '.join(missing)} for the QEMU tests (apt-get)")
    _quiet(["apt-get", "update", "-qq"])
    installed = _quiet(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing])
    if installed.returncode != 0:
        return f"apt-get install {' '.join(missing)} failed: {installed.stderr.strip()[-300:]}"
    return None


def kernel_package_name() -> str | None:
    """linux-image-amd64 is a metapackage; the kernel is in the package it depends on."""
    output = _quiet(["apt-cache", "depends", KERNEL_METAPACKAGE]).stdout
    for line in output.splitlines():
        line = line.strip()
        if line.startswith("Depends: linux-image-"):
            return line.split(":", 1)[1].strip()
    return None


def unpacked_kernel_dir(package: str) -> Path:
    return user_cache_dir() / "test-kernel" / package


def keep_only_what_tests_use(tree: Path, modules: tuple[str, ...] = TEST_KERNEL_MODULES) -> None:
    """Prune an unpacked kernel package to boot/vmlinuz-* and the named modules."""
    wanted_modules = {f"{name}.ko" for name in modules}
    for path in sorted(tree.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        relative = path.relative_to(tree)
        keep = (relative.parts[:1] == ("boot",) and path.name.startswith("vmlinuz-")) or path.name in wanted_modules
        if path.is_dir() and not path.is_symlink():
            if not any(path.iterdir()):
                path.rmdir()
        elif not keep:
            path.unlink()


def prepare_kernel() -> tuple[Path | None, str]:
    package = kernel_package_name()
    if package is None:
        _quiet(["apt-get", "update", "-qq"])
        package = kernel_package_name()
    if package is None:
        return None, f"apt-cache knows no {KERNEL_METAPACKAGE} (run apt-get update?)"
    target = unpacked_kernel_dir(package)
    if list(target.glob("boot/vmlinuz-*")):
        keep_only_what_tests_use(target)  # caches from before pruning held every module
        return target, f"{package} (cached in {target})"
    download_dir = target.with_name(target.name + ".download")
    shutil.rmtree(download_dir, ignore_errors=True)
    download_dir.mkdir(parents=True)
    fetched = _quiet(["apt-get", "download", package], cwd=download_dir)
    debs = list(download_dir.glob("*.deb"))
    if fetched.returncode != 0 or not debs:
        return None, f"apt-get download {package} failed: {fetched.stderr.strip()[-300:]}"
    shutil.rmtree(target, ignore_errors=True)
    extracted = _quiet(["dpkg-deb", "-x", str(debs[0]), str(target)])
    shutil.rmtree(download_dir, ignore_errors=True)
    if extracted.returncode != 0:
        return None, f"dpkg-deb -x failed: {extracted.stderr.strip()[-300:]}"
    keep_only_what_tests_use(target)
    return target, f"{package}: kept its vmlinuz and {', '.join(TEST_KERNEL_MODULES)}.ko in {target}"


NO_HOST_SETUP_VARIABLE = "GPU_K8S_TEST_NO_HOST_SETUP"


def prepare_qemu_test_host(host_setup: bool = True) -> dict[str, str]:
    """Environment for pytest: where the test kernel is; empty when the QEMU tests must skip."""
    console.step("preparing the host for the QEMU tests")
    if not host_setup or os.environ.get(NO_HOST_SETUP_VARIABLE) == "1":
        cached = sorted((user_cache_dir() / "test-kernel").glob("linux-image-*/boot/vmlinuz-*"))
        console.warn("host setup skipped (--no-host-setup): nothing installed or downloaded; "
                     "QEMU tests run only if qemu, busybox-static and a cached test kernel are already there")
        return {KERNEL_DIR_VARIABLE: str(cached[-1].parent.parent)} if cached else {}
    console.info(f"as root this installs {' '.join(APT_PACKAGES)} with apt-get when missing, and keeps a "
                 f"Debian kernel (a few MB) in {user_cache_dir() / 'test-kernel'}; --no-host-setup skips it")
    problem = install_apt_packages()
    if problem:
        console.warn(f"QEMU tests will be SKIPPED: {problem}")
        return {}
    kernel_dir, note = prepare_kernel()
    if kernel_dir is None:
        console.warn(f"QEMU tests will be SKIPPED: {note}")
        return {}
    console.info(f"test kernel: {note}")
    return {KERNEL_DIR_VARIABLE: str(kernel_dir)}
