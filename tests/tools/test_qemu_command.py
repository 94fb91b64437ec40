"""The QEMU command line, without starting QEMU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import qemu


def test_qemu_command_line_has_what_the_smoke_test_needs(tmp_path: Path) -> None:
    config = qemu.QemuConfig(
        kernel=Path("bzImage"), rootfs=Path("img.ext4"), console_log=tmp_path / "c.log", ssh_port=2345, kvm=True
    )
    argv = qemu.qemu_command(config)
    line = " ".join(argv)
    assert "-enable-kvm" in argv and "-nographic" in argv and "-snapshot" in argv
    assert "-m 4096" in line
    assert "hostfwd=tcp:127.0.0.1:2345-:22" in line
    assert "-append root=/dev/vda rw console=ttyS0" in line
    assert f"-serial file:{tmp_path / 'c.log'}" in line


def test_too_little_memory_is_refused() -> None:
    config = qemu.QemuConfig(kernel=Path("k"), rootfs=Path("r"), console_log=Path("c"), ssh_port=1, memory_mib=1024)
    with pytest.raises(qemu.QemuError, match="--memory-mib must be at least 2048"):
        qemu.qemu_command(config)
