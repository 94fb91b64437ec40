"""Choosing the A/B backend from what the image says, and reading what each backend reads."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_k8s_update import settings
from gpu_k8s_update.ab import backend_for, parse_image_info
from gpu_k8s_update.ab.bootenv import MenderGrub, MenderUBoot, parse_env
from gpu_k8s_update.ab.tegra import OS_INDICATIONS, MenderTegra, os_indications_armed, unit_verifies_unconditionally
from gpu_k8s_update.system import SystemStateError


def image(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "image-info"
    path.write_text(text)
    return {"GPU_K8S_UPDATE_IMAGE_INFO": str(path)}


@pytest.mark.parametrize(("name", "kind"), [("mender-grub", MenderGrub), ("mender-uboot", MenderUBoot),
                                            ("mender-tegra", MenderTegra)])
def test_the_image_names_its_backend(tmp_path: Path, name: str, kind: type) -> None:
    chosen = backend_for(settings.load(image(tmp_path, f"artifact_name=1.4.0\nab_backend={name}\n")))
    assert isinstance(chosen, kind) and chosen.name == name
    assert chosen.booted_version() == "1.4.0"


def test_the_setting_overrides_what_the_image_says(tmp_path: Path) -> None:
    env = {**image(tmp_path, "artifact_name=1.4.0\nab_backend=mender-uboot\n"),
           "GPU_K8S_UPDATE_AB_BACKEND": "mender-tegra"}
    assert backend_for(settings.load(env)).name == "mender-tegra"


def test_an_image_without_image_info_has_no_backend_and_says_how_to_get_one(tmp_path: Path) -> None:
    chosen = backend_for(settings.load({"GPU_K8S_UPDATE_IMAGE_INFO": str(tmp_path / "missing")}))
    assert chosen.name == "none"
    assert "this image has no A/B updater" in chosen.check() and "First flash" in chosen.check()
    with pytest.raises(SystemStateError):
        chosen.pending()


@pytest.mark.parametrize(("text", "message"), [
    ("artifact_name=1.4.0\n", "names no ab_backend"),
    ("artifact_name=1.4.0\nab_backend=swupdate\n", "unknown A/B backend 'swupdate'"),
])
def test_an_image_info_without_a_known_backend_is_refused_by_name(tmp_path: Path, text: str, message: str) -> None:
    chosen = backend_for(settings.load(image(tmp_path, text)))
    assert message in chosen.check()


def test_image_info_needs_an_artifact_name() -> None:
    info = parse_image_info("# built 2026\nartifact_name = 1.4.0\nab_backend=mender-grub\n", "x")
    assert info.artifact_name == "1.4.0" and info.ab_backend == "mender-grub"
    with pytest.raises(SystemStateError, match="no artifact_name"):
        parse_image_info("ab_backend=mender-grub\n", "/usr/share/gpu-k8s-update/image-info")


def test_bootloader_environment_lines() -> None:
    assert parse_env("upgrade_available=1\nmender_boot_part=3\nbogus\n") == {"upgrade_available": "1",
                                                                               "mender_boot_part": "3"}


def test_os_indications_is_armed_only_with_the_capsule_on_disk_bit(tmp_path: Path) -> None:
    efivar = tmp_path / OS_INDICATIONS
    assert not os_indications_armed(efivar), "no variable: not armed"
    efivar.write_bytes(b"\x07\x00\x00\x00" + (4).to_bytes(8, "little"))
    assert os_indications_armed(efivar)
    efivar.write_bytes(b"\x07\x00\x00\x00" + (1).to_bytes(8, "little"))
    assert not os_indications_armed(efivar)


@pytest.mark.parametrize(("exec_start", "verifies"), [
    ("{ path=/usr/sbin/nvbootctrl ; argv[]=/usr/sbin/nvbootctrl verify ; ignore_errors=no ; start_time=[n/a] }", True),
    ("{ path=/usr/sbin/tegra-rootfs-verify ; argv[]=/usr/sbin/tegra-rootfs-verify ; ignore_errors=no }", False),
    ("{ path=/usr/sbin/nvbootctrl ; argv[]=/usr/sbin/nvbootctrl dump-slots-info ; ignore_errors=no }", False),
    ("", False),
])
def test_a_boot_verifier_counts_only_when_it_runs_nvbootctrl_verify_itself(exec_start: str, verifies: bool) -> None:
    assert unit_verifies_unconditionally(exec_start) is verifies
