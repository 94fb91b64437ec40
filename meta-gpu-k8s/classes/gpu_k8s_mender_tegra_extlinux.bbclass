# Inherited by our l4t-launcher-extlinux bbappend (dynamic-layers/mender-tegra) only with the A/B
# class. meta-mender-tegra-common boots the Orin Nano devkits with the device tree from the
# rootfs slot (so an update carries it), spelled "/boot/<dtb>"; meta-tegra's l4t-extlinux-config
# strips the prefix and warns at every parse. The same setting, spelled as meta-tegra asks.
UBOOT_EXTLINUX_FDT:jetson-orin-nano-devkit = "${DTBFILE}"
