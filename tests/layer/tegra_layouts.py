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


def rootfs_device(kind: str, uda_file: str | None = None) -> str:
    """The rootfs device of every Orin A/B layout: kernels (A_kernel id 3 on), recovery, ESPs,
    UDA, reserved, then APP (id 1) and APP_b (id 2) last before the backup GPT."""
    return device(kind, [
        partition("master_boot_record", "protective_master_boot_record"),
        partition("primary_gpt", "primary_gpt"),
        partition("A_kernel", "kernel", pid=3, filename="LNXFILE"),
        partition("A_kernel-dtb", "kernel_dtb", filename="DTB_FILE"),
        partition("A_reserved_on_user"),
        partition("B_kernel", "kernel", filename="LNXFILE_b"),
        partition("B_kernel-dtb", "kernel_dtb", filename="DTB_FILE"),
        partition("B_reserved_on_user"),
        partition("RECNAME", "kernel", filename="RECFILE"),
        partition("RECDTB-NAME", "kernel_dtb", filename="RECDTB-FILE"),
        partition("esp", filename="ESP_FILE", attribute="0x8"),
        partition("RECNAME_alt", "kernel"),
        partition("RECDTB-NAME_alt", "kernel_dtb"),
        partition("esp_alt", attribute="0x8"),
        partition("UDA", filename=uda_file, size="419430400"),
        partition("reserved"),
        partition("APP", pid=1, filename="APPFILE", attribute="0x8", size="APPSIZE"),
        partition("APP_b", pid=2, filename="APPFILE_b", attribute="0x8", size="APPSIZE"),
        partition("secondary_gpt", "secondary_gpt", size="0xFFFFFFFFFFFFFFFF"),
    ])


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
# jetson-agx-orin-devkit: QSPI and eMMC user area in one template
EMMC_TEMPLATE = layout(qspi_device(), rootfs_device("sdmmc_user"))
