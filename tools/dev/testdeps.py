"""What the QEMU tests in tests/tools need from the host, installed from Debian's packages.

`./task test` calls `prepare_qemu_test_host` before pytest: it installs qemu-system-x86,
busybox-static (and mender-artifact, for the release tests) with apt-get (as root, when
missing) and unpacks a Debian kernel package into the user cache (apt-get download +
dpkg-deb -x: no postinst, nothing changes in /boot),
keeping only the kernel and the one module the tests load (a few MB, not the package's
~400 MB). It says so before doing it; `./task test --no-host-setup` (or
GPU_K8S_TEST_NO_HOST_SETUP=1) changes nothing on the host. When the QEMU tests cannot run,
they skip and say why (KERNEL_DIR_VARIABLE unset), and the suite's leg says so instead of
"pass". Another apt process (unattended-upgrades, a second terminal) holding apt's locks is
waited for, not taken as a reason to skip."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tools import console
from tools.paths import user_cache_dir

KERNEL_DIR_VARIABLE = "GPU_K8S_TEST_KERNEL_DIR"
# mender-artifact (Debian's 3.9.0): tests/tools/test_release.py checks release against artifacts
# it signs, and the test artifacts against its validate (skipped, saying so, where it is absent).
APT_PACKAGES = ("qemu-system-x86", "busybox-static", "mender-artifact")
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


# How long to wait for another apt process before giving up. apt-get install waits for the
# dpkg lock itself (DPkg::Lock::Timeout); apt-get update does not for the package lists' lock
# (apt 2.6 fails at once), so that one is waited for here.
APT_LOCK_TIMEOUT_S = 900
APT_LISTS_LOCK = Path("/var/lib/apt/lists/lock")
LOCK_POLL_S = 1.0
_LOCK_HELD = "could not get lock"


def lock_is_free(path: Path) -> bool:
    """Whether nobody holds apt's lock on path (a POSIX record lock, as apt takes it)."""
    try:
        descriptor = os.open(path, os.O_RDWR)
    except OSError:
        return True  # no lock file (or not ours to check): apt-get will say
    try:
        fcntl.lockf(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(descriptor)  # closing drops the lock we may have taken
    return True


def wait_for_lock(path: Path, timeout_s: float, clock: Callable[[], float] = time.monotonic,
                  pause: Callable[[float], None] = time.sleep) -> bool:
    """True once the lock on path is free, False when timeout_s passed first."""
    deadline = clock() + timeout_s
    while not lock_is_free(path):
        if clock() >= deadline:
            return False
        pause(LOCK_POLL_S)
    return True


def update_package_lists() -> str | None:
    """apt-get update, waiting for another apt process that holds the lists' lock; None
    when done, else why not. Other failures (no network) are left to the install to judge."""
    deadline = time.monotonic() + APT_LOCK_TIMEOUT_S
    while True:
        updated = _quiet(["apt-get", "update", "-qq"])
        if updated.returncode == 0 or _LOCK_HELD not in updated.stderr.lower():
            return None
        console.info(f"another apt process holds {APT_LISTS_LOCK}: waiting for it (at most {APT_LOCK_TIMEOUT_S} s)")
        if not wait_for_lock(APT_LISTS_LOCK, max(0.0, deadline - time.monotonic())):
            return f"another apt process held {APT_LISTS_LOCK} for {APT_LOCK_TIMEOUT_S} s"


def install_apt_packages() -> str | None:
    """None when the packages are there; otherwise why they are not."""
    if shutil.which("dpkg-query") is None:
        return "not a Debian/Ubuntu host (no dpkg-query): install qemu-system-x86_64 and a static busybox"
    missing = [p for p in APT_PACKAGES if not package_installed(p)]
    if not missing:
        return None
    if os.geteuid() != 0:
        return f"missing {' '.join(missing)} and not root: sudo apt-get install {' '.join(missing)}"
    console.info(f"installing {' '.join(missing)} for the QEMU and release tests (apt-get)")
    problem = update_package_lists()
    if problem:
        return problem
    installed = _quiet(["apt-get", "-o", f"DPkg::Lock::Timeout={APT_LOCK_TIMEOUT_S}", "install", "-y", "-qq",
                        "--no-install-recommends", *missing])
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


@dataclass(frozen=True)
class QemuTestSetup:
    env: dict[str, str]  # for pytest: where the test kernel is; empty when the QEMU tests skip
    skipped: str = ""  # why they skip ('' when they run)
    asked: bool = True  # host setup was asked for (not --no-host-setup)


def qemu_test_setup(host_setup: bool = True) -> QemuTestSetup:
    console.step("preparing the host for the QEMU tests")
    if not host_setup or os.environ.get(NO_HOST_SETUP_VARIABLE) == "1":
        cached = sorted((user_cache_dir() / "test-kernel").glob("linux-image-*/boot/vmlinuz-*"))
        console.warn("host setup skipped (--no-host-setup): nothing installed or downloaded; "
                     "QEMU tests run only if qemu, busybox-static and a cached test kernel are already there")
        if cached:
            return QemuTestSetup({KERNEL_DIR_VARIABLE: str(cached[-1].parent.parent)}, asked=False)
        return QemuTestSetup({}, "--no-host-setup and no cached test kernel", asked=False)
    console.info(f"as root this installs {' '.join(APT_PACKAGES)} with apt-get when missing, and keeps a "
                 f"Debian kernel (a few MB) in {user_cache_dir() / 'test-kernel'}; --no-host-setup skips it")
    problem = install_apt_packages()
    if problem:
        console.warn(f"QEMU tests will be SKIPPED: {problem}")
        return QemuTestSetup({}, problem)
    kernel_dir, note = prepare_kernel()
    if kernel_dir is None:
        console.warn(f"QEMU tests will be SKIPPED: {note}")
        return QemuTestSetup({}, note)
    console.info(f"test kernel: {note}")
    return QemuTestSetup({KERNEL_DIR_VARIABLE: str(kernel_dir)})


def prepare_qemu_test_host(host_setup: bool = True) -> dict[str, str]:
    """Environment for pytest: where the test kernel is; empty when the QEMU tests must skip."""
    return qemu_test_setup(host_setup).env
