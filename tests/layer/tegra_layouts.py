"""Flash layouts shaped like L4T R39's Orin layouts, written here from their facts (device
types, partition names, ids, order, the UDA-before-slots arrangement), not copied: what
lib/gpu_k8s/tegra_layout.py is tested on. Each partition is written the way NVIDIA's files
write them (name first, id, type; children one per line)."""

from __future__ import annotations


def partition(name: str, kind: str = "data", pid: int | None = None, filename: str | None = None,
              attribute: str = "8", size: str = "1048576") -> str:
    ident = f' id="{pid}"' if pid is not None else ""
    lines = [f'        <partition name="{name}"{ident} type="{kind}">',
             "            <allocation_policy> sequential </allocation_policy>",
             f"            <size> {size} </size>",
             f"            <allocation_attribute> {attribute} </allocation_attribute>"]
    if filename:
        lines.append(f"            <filename> {filename} </filename>")
    lines.append("        </partition>")
    return "\n".join(lines) + "\n"


def device(kind: str, partitions: list[str]) -> str:
    return f'    <device type="{kind}" instance="0" sector_size="512" num_sectors="NUM_SECTORS" >\n' + \
        "".join(partitions) + "    </device>\n"


def layout(*devices: str) -> str:
    return '<?xml version="1.0"?>\n<!-- test layout -->\n<partition_layout version="01.00.0000">\n' + \
        "".join(devices) + "</partition_layout>\n"


# NVIDIA's sizes of the rootfs device's partitions, in bytes, as L4T's
# flash_t234_qspi_sd_rootfs_ab.xml gives them (the L4T R36 copy in Seeed-Studio/Linux_for_Tegra
# 9666ddf9; the R39.2 BSP tarball is not in our mirrors): the kernels and their device trees, the
# space reserved beside them, the ESPs, UDA and the reserved space ahead of the slots. RECSIZE is
# meta-tegra's TEGRA_RECOVERY_KERNEL_PART_SIZE (image_types_tegra.bbclass, 80 MiB).
NVIDIA_SIZES = {
    "A_kernel": "134217728", "A_kernel-dtb": "786432", "A_reserved_on_user": "33161216",
    "B_kernel": "134217728", "B_kernel-dtb": "786432", "B_reserved_on_user": "33161216",
    "RECNAME": "RECSIZE", "RECDTB-NAME": "524288", "esp": "67108864",
    "RECNAME_alt": "RECSIZE", "RECDTB-NAME_alt": "524288", "esp_alt": "67108864",
    "UDA": "419430400", "reserved": "502792192",
}
RECSIZE = 83886080
# meta-tegra's ROOTFSPART_SIZE_DEFAULT for the Orin Nano and AGX Orin (orin-nano.inc, agx-orin.inc);
# the redundant layout gives each slot half of it (tegra-common.inc: ROOTFSPART_SIZE_REDUNDANT).
ROOTFSPART_SIZE_DEFAULT = 30064771072


def rootfs_device(kind: str, uda_file: str | None = None, sizes: dict[str, str] | None = None) -> str:
    """The rootfs device of every Orin A/B layout: kernels (A_kernel id 3 on), recovery, ESPs,
    UDA, reserved, then APP (id 1) and APP_b (id 2) last before the backup GPT. `sizes`
    (NVIDIA_SIZES) gives the partitions NVIDIA's sizes; without it they are 1 MiB (UDA 400 MiB)."""
    def size(name: str) -> str:
        return (sizes or {}).get(name, "419430400" if name == "UDA" else "1048576")

    return device(kind, [
        partition("master_boot_record", "protective_master_boot_record"),
        partition("primary_gpt", "primary_gpt"),
        partition("A_kernel", "kernel", pid=3, filename="LNXFILE", size=size("A_kernel")),
        partition("A_kernel-dtb", "kernel_dtb", filename="DTB_FILE", size=size("A_kernel-dtb")),
        partition("A_reserved_on_user", size=size("A_reserved_on_user")),
        partition("B_kernel", "kernel", filename="LNXFILE_b", size=size("B_kernel")),
        partition("B_kernel-dtb", "kernel_dtb", filename="DTB_FILE", size=size("B_kernel-dtb")),
        partition("B_reserved_on_user", size=size("B_reserved_on_user")),
        partition("RECNAME", "kernel", filename="RECFILE", size=size("RECNAME")),
        partition("RECDTB-NAME", "kernel_dtb", filename="RECDTB-FILE", size=size("RECDTB-NAME")),
        partition("esp", filename="ESP_FILE", attribute="0x8", size=size("esp")),
        partition("RECNAME_alt", "kernel", size=size("RECNAME_alt")),
        partition("RECDTB-NAME_alt", "kernel_dtb", size=size("RECDTB-NAME_alt")),
        partition("esp_alt", attribute="0x8", size=size("esp_alt")),
        partition("UDA", filename=uda_file, size=size("UDA")),
        partition("reserved", size=size("reserved")),
        partition("APP", pid=1, filename="APPFILE", attribute="0x8", size="APPSIZE"),
        partition("APP_b", pid=2, filename="APPFILE_b", attribute="0x8", size="APPSIZE"),
        partition("secondary_gpt", "secondary_gpt", size="0xFFFFFFFFFFFFFFFF"),
    ])


def as_packaged(text: str, slot_bytes: int, num_sectors: int = 0) -> str:
    """A layout as it stands in a tegraflash package: the size tokens filled in as meta-tegra's
    tegraflash_create_flash_config fills them (APPSIZE with ROOTFSPART_SIZE, RECSIZE)."""
    return (text.replace("APPSIZE", str(slot_bytes)).replace("RECSIZE", str(RECSIZE))
            .replace("NUM_SECTORS", str(num_sectors)))


def qspi_device(count: int = 60) -> str:
    """The boot QSPI: dozens of boot-chain partitions, some with ids nvflashxmlparse ignores."""
    parts = [partition("BCT", "boot_config_table")]
    parts += [partition(f"A_part{i}", pid=90 + i) for i in range(count - 1)]
    return device("spi", parts)


# jetson-orin-nano-devkit-nvme: the QSPI-only template and the external NVMe layout
NVME_TEMPLATE = layout(qspi_device())
NVME_EXTERNAL = layout(rootfs_device("external"))
# meta-mender-tegra-common's older bbappend puts the data image on UDA
NVME_EXTERNAL_DATA_ON_UDA = layout(rootfs_device("external", uda_file="DATAFILE"))
# jetson-orin-nano-devkit: QSPI and SD card in one template
SD_TEMPLATE = layout(qspi_device(), rootfs_device("sdcard"))
# the same with NVIDIA's partition sizes (flash_t234_qspi_sd_rootfs_ab.xml)
SD_TEMPLATE_SIZED = layout(qspi_device(), rootfs_device("sdcard", sizes=NVIDIA_SIZES))
# jetson-agx-orin-devkit: QSPI and eMMC user area in one template
EMMC_TEMPLATE = layout(qspi_device(), rootfs_device("sdmmc_user"))
