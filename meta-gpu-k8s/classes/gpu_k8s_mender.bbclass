# A/B root filesystems with Mender in standalone mode (no Mender server) for the gpu-k8s
# node images: two root slots, a data partition that outlives a slot switch, a boot
# counter that falls back to the old slot, signed update artifacts.
#
# A global class: opt in with INHERIT += "gpu_k8s_mender" (kas/include/mender.yml does it).
# Needs meta-mender-core; on qemux86-64 also meta-mender-qemu (OVMF); on Jetson the series'
# meta-mender-tegra layers (conf/series/: jetpack4 for the Nano on kirkstone,
# kas/include/mender-tegra-jetpack4.yml; common + native + jetpack7 for the Orin on wrynose,
# kas/include/mender-tegra-native.yml). Without the INHERIT the layer changes nothing.

inherit mender-full

# Jetson: the series' Mender Tegra class (GPU_K8S_TEGRA_MENDER_CLASS in conf/series/): the
# Nano's U-Boot boot counter, tegraflash + dataimg and two-slot layout (tegra-mender-setup,
# kirkstone), or the Orin's and Thor's native UEFI scheme (tegra-mender-native, wrynose), which
# brings tegra-mender-common with it. Only on tegra machines: x86 builds lack those layers.
def gpu_k8s_tegra_mender_class(d):
    if 'tegra' not in (d.getVar('MACHINEOVERRIDES') or '').split(':'):
        return ''
    layer = d.getVar('GPU_K8S_TEGRA_MENDER_LAYER')
    if layer not in (d.getVar('BBFILE_COLLECTIONS') or '').split():
        bb.fatal('A/B images for %s need meta-mender-community\'s %s layer, which is not in BBLAYERS: '
                 'build with the kas file of the machine (kas/jetson-nano.yml, kas/jetson-orin-nano.yml, '
                 'kas/jetson-agx-thor.yml), which includes it' % (d.getVar('MACHINE'), layer))
    return d.getVar('GPU_K8S_TEGRA_MENDER_CLASS')

inherit ${@gpu_k8s_tegra_mender_class(d)}

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
# command line), so both slots boot with the same one. Tegra enables it in its Mender class
# (the Orin and Thor keep it in UEFI's KernelCommandLine variable).
MENDER_FEATURES_ENABLE:append:x86-64 = " mender-persist-systemd-machine-id"

# The Orin (and Thor) boot through UEFI and L4TLauncher: no U-Boot. meta-mender-tegra-common
# enables Mender's U-Boot integration on every tegra SoC and leaves it to the configuration to
# turn off; left on, the client's runtime dependencies ask for a U-Boot nobody provides.
MENDER_FEATURES_DISABLE:append:tegra234 = " mender-uboot"
MENDER_FEATURES_DISABLE:append:tegra264 = " mender-uboot"

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
TEGRA_MENDER_RESERVED_SPACE_MB:tegra210 = "1974"
MENDER_DATA_PART_SIZE_MB_DEFAULT:tegra = "4096"

# Jetson Orin: the root slots are meta-tegra's (ROOTFSPART_SIZE_DEFAULT halved: 14 GiB each on
# the Orin Nano and AGX Orin devkits; meta-mender-tegra sizes Mender's rootfs image from them).
# The data partition is our own (classes/gpu_k8s_mender_tegra_layout.bbclass): partition 17,
# right after APP_b on the rootfs device (NVMe, SD card or eMMC), filling the rest of it. NVIDIA's
# UDA (partition 15, 400 MiB, ahead of the slots) stays as NVIDIA ships it. The data image
# flashed into it is 1 GiB and grows to the partition at first boot (mender-growfs-data).
MENDER_DATA_PART_SIZE_MB_DEFAULT:tegra234 = "1024"
MENDER_DATA_PART_NUMBER:tegra234 = "17"
# Jetson Thor: the same scheme on meta-tegra's t264 NVMe A/B layout (flash_l4t_t264_nvme_rootfs_ab.xml,
# which meta-mender-tegra-common selects for tegra264 too): APP p1, APP_b p2, 25 GiB each
# (ROOTFSPART_SIZE_DEFAULT 50 GiB halved), NVIDIA's UDA p11 and reserved p12 ahead of them, so our
# data partition after APP_b is p13 = /dev/nvme0n1p13 (meta-mender-tegra-common's own default,
# 11, is UDA). The layout class stops the build if the layout numbers it otherwise.
MENDER_DATA_PART_SIZE_MB_DEFAULT:tegra264 = "1024"
MENDER_DATA_PART_NUMBER:tegra264 = "13"
# The SD-card devkit writes its card with that layout: two 14 GiB slots, NVIDIA's 1.56 GB of
# boot partitions and the data image need a card of 64 GB (NVIDIA's minimum for an SD root).
# One value for the layer and ./task flash (dosdcard.sh -s): lib/gpu_k8s/tegra_sdcard.py.
# (The NVMe devkit carries the same override and writes no card.)
TEGRAFLASH_SDCARD_SIZE:jetson-orin-nano-devkit = "${@gpu_k8s_lib(d, 'gpu_k8s.tegra_sdcard').ORIN_SD_CARD_SIZE}"

# The boot firmware capsule is applied only when its FMP image type GUID matches the one built
# into the running UEFI, and from L4T R38 on each UEFI configuration has its own. Settled here,
# before the first flash: the GUID of the full-featured t23x "general" configuration the
# images boot (meta-tegra docs/UEFI-Capsule-Update.md, option 1), written into the firmware and
# every capsule, so a later move to the minimal-boot configuration keeps accepting capsules;
# on Thor the t26x "general" configuration's, from the same page.
TEGRA_UEFI_SYSTEM_IMAGE_TYPE_GUID:tegra234 ?= "bf0d4599-20d4-414e-b2c5-3595b1cda402"
TEGRA_UEFI_SYSTEM_IMAGE_TYPE_GUID:tegra264 ?= "3c834404-d2d7-4912-8c1c-6e850b5f2824"

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
# Mender's own artifact type, and the native Tegra scheme's (the Orin, Thor), which replaces it in
# IMAGE_FSTYPES and writes the same .mender file, signed only when a key happens to be set.
GPU_K8S_ARTIFACT_TYPES = "mender tegra-mender-native"
GPU_K8S_ARTIFACT_SIGNING_CHECK = "${@'gpu_k8s_check_artifact_signing' if set(d.getVar('GPU_K8S_ARTIFACT_TYPES').split()) & set((d.getVar('IMAGE_FSTYPES') or '').split()) else ''}"
do_rootfs[prefuncs] += "${GPU_K8S_ARTIFACT_SIGNING_CHECK}"
do_image_mender[prefuncs] += "gpu_k8s_check_artifact_signing"
do_image_tegra_mender_native[prefuncs] += "gpu_k8s_check_artifact_signing"

# The verify key the root filesystem holds, deployed beside the image's manifest
# (IMAGE-MACHINE-DATETIME.artifact-verify-key.pem and its stable link): `./task release`
# refuses an artifact whose signature that key would reject (docs/fleet.md).
python gpu_k8s_deploy_verify_key() {
    gpu_k8s_lib(d, 'gpu_k8s.signing').deploy_verify_key(
        d.expand('${IMAGE_ROOTFS}${sysconfdir}/mender/artifact-verify-key.pem'),
        d.getVar('IMAGE_MANIFEST'), d.getVar('IMGDEPLOYDIR'), d.getVar('IMAGE_LINK_NAME'))
}
do_rootfs[postfuncs] += "gpu_k8s_deploy_verify_key"
