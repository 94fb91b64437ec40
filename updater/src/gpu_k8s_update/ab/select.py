"""Which backend this image uses. The image says so: the gpu-k8s-update recipe writes
`ab_backend=` into image-info from the Mender integration the image was built with, so the
agent never guesses from the tools it finds (an Orin image carries Mender's stock rootfs-image
module too, an x86-64 image may carry U-Boot's tools). GPU_K8S_UPDATE_AB_BACKEND overrides it."""

from __future__ import annotations

from gpu_k8s_update.ab.bootenv import MenderGrub, MenderUBoot
from gpu_k8s_update.ab.interface import ABBackend, read_image_info
from gpu_k8s_update.ab.mender import FIRST_FLASH_HINT
from gpu_k8s_update.ab.tegra import MenderTegra
from gpu_k8s_update.model import BootState
from gpu_k8s_update.settings import AB_BACKENDS, Settings
from gpu_k8s_update.system import CommandResult, SystemStateError

BACKEND_NAMES = AB_BACKENDS


class NoBackend:
    """An image that cannot take A/B updates: check() says why, everything else refuses."""

    name = "none"

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def check(self) -> str:
        return self.reason

    def _refuse(self) -> SystemStateError:
        return SystemStateError(self.reason)

    def booted_version(self) -> str:
        raise self._refuse()

    def pending(self) -> BootState:
        raise self._refuse()

    def install(self, source: str) -> CommandResult:
        raise self._refuse()

    def commit(self) -> CommandResult:
        raise self._refuse()

    def rollback(self) -> CommandResult:
        raise self._refuse()

    def slots(self) -> dict[str, str]:
        raise self._refuse()


def backend_for(settings: Settings) -> ABBackend:
    name = settings.ab_backend
    if not name:
        try:
            name = read_image_info(settings.image_info).ab_backend
        except SystemStateError as error:
            return NoBackend(f"this image has no A/B updater ({error}): it cannot install OS updates or roll back; "
                             f"{FIRST_FLASH_HINT}")
        if not name:
            return NoBackend(f"{settings.image_info} names no ab_backend: rebuild the image with this layer's "
                             "gpu-k8s-update recipe, or set GPU_K8S_UPDATE_AB_BACKEND to one of "
                             + ", ".join(BACKEND_NAMES))
    if name == "mender-grub":
        return MenderGrub(settings.mender_command, settings.image_info)
    if name == "mender-uboot":
        return MenderUBoot(settings.mender_command, settings.image_info)
    if name == "mender-tegra":
        return MenderTegra(
            settings.mender_command, settings.image_info, nvbootctrl=settings.nvbootctrl_command,
            systemctl=settings.systemctl_command, pending_file=settings.tegra_pending_file,
            update_module=settings.tegra_update_module, esp_capsule=settings.esp_capsule,
            efivars_dir=settings.efivars_dir,
        )
    return NoBackend(f"unknown A/B backend {name!r} (from {settings.image_info}): this agent knows "
                     + ", ".join(BACKEND_NAMES) + "; update gpu-k8s-update with the image")
