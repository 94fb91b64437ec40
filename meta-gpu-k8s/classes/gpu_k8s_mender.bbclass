# A/B root filesystems with Mender in standalone mode (no Mender server) for the gpu-k8s
# node images: two root slots, a data partition that outlives a slot switch, a boot
# counter that falls back to the old slot, signed update artifacts.
#
# A global class: opt in with INHERIT += "gpu_k8s_mender" (kas/include/mender.yml does it).
# Needs meta-mender-core; on Jetson also meta-mender-tegra/meta-mender-tegra-jetpack4, and
# on qemux86-64 meta-mender-qemu (OVMF). Without the INHERIT the layer changes nothing.

inherit mender-full
# U-Boot boot counter, tegraflash + dataimg, the Nano's two-slot flash layout.
inherit ${@'tegra-mender-setup' if 'tegra' in (d.getVar('MACHINEOVERRIDES') or '').split(':') else ''}

# Our own recipes and bbappends test this override, never the INHERIT itself.
# nooelint: oelint.vars.outofcontext - a global class, the opt-in for a distro-wide setting
DISTRO_FEATURES:append = " gpu-k8s-mender"
# nooelint: oelint.vars.outofcontext,oelint.vars.inconspaces - an override list is joined by colons, not spaces
DISTROOVERRIDES:append = ":gpu-k8s-mender"

# The release version is the artifact name: /etc/mender/artifact_info on the node, the
# --version of `./task release` and `./task rollout`. Set it in the environment
# (kas passes GPU_K8S_VERSION through) or in local.conf.
GPU_K8S_VERSION ??= "dev"
MENDER_ARTIFACT_NAME = "${GPU_K8S_VERSION}"

# The machine-id lives in the bootloader environment (systemd.machine_id= on the kernel
# command line), so both slots boot with the same one. Tegra enables it in tegra-mender-setup.
MENDER_FEATURES_ENABLE:append:x86-64 = " mender-persist-systemd-machine-id"

# The C++ client (mender 5.x) with its `mender-update` command; meta-mender's kirkstone
# default is the end-of-life Go client 3.5 (`mender install`).
PREFERRED_PROVIDER_mender-native = "mender-native"
PREFERRED_RPROVIDER_mender-auth = "mender"
PREFERRED_RPROVIDER_mender-update = "mender"

# Standalone mode: `mender-update install|commit|rollback` driven by gpu-k8s-update. The
# daemons would poll a server we do not have and must not race the health gate's commit.
# nooelint: oelint.vars.specific - a pn- override for meta-mender's client recipe
SYSTEMD_AUTO_ENABLE:pn-mender = "disable"

# ---- storage ------------------------------------------------------------------------
# Sizes in MiB. The data partition holds docker's images and k3s's state; mender-growfs-data
# (on by default in mender-full) grows it to the end of the disk on the first boot.

# genericx86-64: one image for SATA (/dev/sda) and NVMe (/dev/nvme0n1) disks, so
# partitions are found by fixed GPT PARTUUIDs rather than by device names.
MENDER_FEATURES_ENABLE:append:genericx86-64 = " mender-partuuid"
MENDER_STORAGE_DEVICE:genericx86-64 = ""
MENDER_BOOT_PART:genericx86-64 = "/dev/disk/by-partuuid/2c3ea3f4-9d1b-4c59-9a07-6f3c1e0b0a01"
MENDER_ROOTFS_PART_A:genericx86-64 = "/dev/disk/by-partuuid/2c3ea3f4-9d1b-4c59-9a07-6f3c1e0b0a02"
MENDER_ROOTFS_PART_B:genericx86-64 = "/dev/disk/by-partuuid/2c3ea3f4-9d1b-4c59-9a07-6f3c1e0b0a03"
MENDER_DATA_PART:genericx86-64 = "/dev/disk/by-partuuid/2c3ea3f4-9d1b-4c59-9a07-6f3c1e0b0a04"
# An 8 GiB image (fits any disk or USB stick of 8 GB and up): 2 x ~3.5 GiB root slots and a
# 1 GiB data partition that grows to the rest of the disk at first boot.
MENDER_STORAGE_TOTAL_SIZE_MB_DEFAULT:genericx86-64 = "8192"
MENDER_DATA_PART_SIZE_MB_DEFAULT:genericx86-64 = "1024"

# qemux86-64: the smoke test attaches the disk as virtio-blk.
MENDER_STORAGE_DEVICE:qemux86-64 = "/dev/vda"
MENDER_STORAGE_TOTAL_SIZE_MB_DEFAULT:qemux86-64 = "8192"
MENDER_DATA_PART_SIZE_MB_DEFAULT:qemux86-64 = "4096"

# Jetson Nano: space kept for the boot firmware partitions of the flash layout (as OE4T's
# tegra-demo-distro), 4 GiB of data; each root slot is about (card - 1974 - 4096) / 2.
TEGRA_MENDER_RESERVED_SPACE_MB:tegra = "1974"
MENDER_DATA_PART_SIZE_MB_DEFAULT:tegra = "4096"
# The initramfs images build with the node image; they must not inherit its image types,
# or tegraflash and the initramfs wait on each other (a circular dependency).
# nooelint: oelint.vars.specific - pn- overrides for meta-tegra's initramfs recipes
IMAGE_FSTYPES:pn-tegra-minimal-initramfs:tegra = "${INITRAMFS_FSTYPES}"
# nooelint: oelint.vars.specific - pn- overrides for meta-tegra's initramfs recipes
IMAGE_FSTYPES:pn-tegra-initrd-flash-initramfs:tegra = "${TEGRA_INITRD_FLASH_INITRAMFS_FSTYPES}"

# ---- signed artifacts -----------------------------------------------------------------
# MENDER_ARTIFACT_SIGNING_KEY: the private key that signs the .mender artifact, a file on the
# build host outside the repository. MENDER_ARTIFACT_VERIFY_KEY: its public key, installed
# as /etc/mender/artifact-verify-key.pem: the node then refuses unsigned artifacts and those
# signed by another key. Both come from the environment (kas passes them through) or site.conf.
# GPU_K8S_ARTIFACT_SIGNING: "required" (gpu-k8s-image: no keys, no image), "optional"
# (the debug image: signs and verifies when keys are given) or "off".
GPU_K8S_ARTIFACT_SIGNING ??= "required"
# nooelint: oelint.vars.specific - a pn- override for our own debug image
GPU_K8S_ARTIFACT_SIGNING:pn-gpu-k8s-image-dev ??= "optional"

python gpu_k8s_check_artifact_signing() {
    # gpu_k8s_lib: classes/gpu_k8s_series.bbclass (our lib/ on every series).
    signing = gpu_k8s_lib(d, 'gpu_k8s.signing')
    problems = signing.signing_problems(
        d.getVar('GPU_K8S_ARTIFACT_SIGNING'),
        d.getVar('MENDER_ARTIFACT_SIGNING_KEY'),
        d.getVar('MENDER_ARTIFACT_VERIFY_KEY'),
    )
    if problems:
        bb.fatal('%s: %s' % (d.getVar('PN'), '; '.join(problems)))
}
# Checked before the root filesystem is made (the verify key goes into it) and again
# before the artifact is written; at parse time a missing key must not stop other builds.
do_rootfs[prefuncs] += "${@'gpu_k8s_check_artifact_signing' if 'mender' in (d.getVar('IMAGE_FSTYPES') or '').split() else ''}"
do_image_mender[prefuncs] += "gpu_k8s_check_artifact_signing"
