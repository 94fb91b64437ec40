"""How a node image mounts /data (pure: fstab text in, fstab text out).

meta-mender writes the data partition's line as `<part> /data <type> defaults 0 2`: required by
local-fs.target, so a /data that does not mount ends the boot in emergency mode, where no
health gate and no slot verification ever runs (both slots end unverified), and checked by
systemd-fsck, which stops at what `e2fsck -p` cannot fix. The layer's line is `nofail`, still
ordered before local-fs.target (so every service that reads /data waits for it as before), and
checked by gpu-k8s-data-check.service, which data.mount requires: it repairs, or when nothing
is left to repair makes a new file system, before the mount (so pass 0: no systemd-fsck).

Used by classes/gpu_k8s_mender.bbclass when the node image's root filesystem is made; kept free
of bitbake so the tests can call it."""

from __future__ import annotations

import re

MOUNT_POINT = "/data"
CHECK_UNIT = "gpu-k8s-data-check.service"
# What the line must carry, in this order after the options it already has.
OPTIONS = ("nofail", "x-systemd.before=local-fs.target", f"x-systemd.requires={CHECK_UNIT}")
# The file systems gpu-k8s-data-check knows how to check and make.
MKFS_TYPES = ("ext2", "ext3", "ext4")
SETTINGS_FILE = "default/gpu-k8s-data"  # under sysconfdir; the check unit's EnvironmentFile
_WORD = re.compile(r"^[A-Za-z0-9._-]*$")


class DataMountError(ValueError):
    """The image's fstab or settings cannot give a /data that repairs itself."""


def rewrite_fstab(text: str) -> str:
    """The fstab with its one /data line made nofail, ordered before local-fs.target, checked by
    gpu-k8s-data-check (pass 0); every other line as it was."""
    lines = text.splitlines()
    found = [i for i, line in enumerate(lines)
             if not line.lstrip().startswith("#") and len(line.split()) >= 2 and line.split()[1] == MOUNT_POINT]
    if not found:
        raise DataMountError("/etc/fstab has no /data line: meta-mender writes one for the data partition "
                             "(MENDER_DATA_PART); without it nothing keeps the node's state across an update")
    if len(found) > 1:
        numbers = ", ".join(str(i + 1) for i in found)
        raise DataMountError(f"/etc/fstab mounts /data {len(found)} times (lines {numbers}); leave one, meta-mender's")
    index = found[0]
    fields = lines[index].split()
    if len(fields) < 4:
        raise DataMountError(f"/etc/fstab's /data line has no options field: {lines[index]!r}")
    spec, point, fstype, options = fields[:4]
    dump = fields[4] if len(fields) > 4 else "0"
    merged = ",".join([*(option for option in options.split(",") if option and option not in OPTIONS), *OPTIONS])
    lines[index] = f"{spec:<20} {point:<20} {fstype:<10} {merged} {dump} 0"
    return "\n".join(lines) + "\n"


def check_settings(mkfs_type: str, label: str, partname: str) -> str:
    """/etc/default/gpu-k8s-data: the data partition as the image made it, which the check
    needs to recognise it and, when it is lost, to make it again."""
    if mkfs_type not in MKFS_TYPES:
        raise DataMountError(f"the data partition is {mkfs_type or '(unset)'}; gpu-k8s-data-check repairs and remakes "
                             f"only {', '.join(MKFS_TYPES)}: set MENDER_DATA_PART_FSTYPE to one of them")
    for name, value in (("MENDER_DATA_PART_LABEL", label), ("GPU_K8S_DATA_PARTNAME", partname)):
        if not _WORD.match(value):
            raise DataMountError(f"{name} {value!r} must be letters, digits, '.', '_' or '-'")
    if not label:
        raise DataMountError("MENDER_DATA_PART_LABEL is empty: a remade data partition needs its label")
    return ("# gpu-k8s-data-check.service: the data partition as this image made it (written at do_rootfs)\n"
            f"GPU_K8S_DATA_MKFS_TYPE={mkfs_type}\nGPU_K8S_DATA_LABEL={label}\nGPU_K8S_DATA_PARTNAME={partname}\n")
