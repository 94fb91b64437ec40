#!/bin/sh
# Before /data is mounted (data.mount requires this: x-systemd.requires in /etc/fstab, which
# the image writes): make the data partition mountable, so that a damaged /data never stops
# a board from booting and keeping its slot. In order:
#   1. e2fsck -p, the usual boot-time check;
#   2. e2fsck -fy, which also fixes what -p leaves for a person and finds backup superblocks;
#   3. a trial mount;
#   4. when none of that gives a file system that mounts: a new one, of the type and with the
#      label the image made it with, but only on a partition that is ours (its GPT name, where
#      the image names one) and holds our kind of file system or none: never another one's
#      (an ESP, swap, a slot of another type).
# Exit 0: /data can be mounted (ok, repaired, recreated). Exit 1: it cannot; the boot goes
# on without it (fstab: nofail), the workloads that need it do not start, the slot is still
# verified. Every verdict goes to the journal and, as one JSON line, to
# /run/gpu-k8s/data-state.json for this boot (gpu-k8s-data files a repair or a new file
# system in /data/gpu-k8s/data-events.log, `gpu-k8s-update status` and the gate can read it).
# Settings (/etc/default/gpu-k8s-data, written by the image): GPU_K8S_DATA_MKFS_TYPE,
# GPU_K8S_DATA_LABEL, GPU_K8S_DATA_PARTNAME, GPU_K8S_DATA_DEVICE_TIMEOUT (seconds).
# GPU_K8S_ROOT prefixes /etc/fstab, /dev, /sys and /run, whose device nodes are then image
# files (tests).
set -u

root=${GPU_K8S_ROOT:-}
fstab=$root/etc/fstab
mountinfo=${GPU_K8S_MOUNTINFO:-/proc/self/mountinfo}
state_file=$root${GPU_K8S_DATA_STATE:-/run/gpu-k8s/data-state.json}
probe_dir=$root/run/gpu-k8s/data-check
mkfs_type=${GPU_K8S_DATA_MKFS_TYPE:-ext4}
label=${GPU_K8S_DATA_LABEL:-data}
partname=${GPU_K8S_DATA_PARTNAME:-}
timeout=${GPU_K8S_DATA_DEVICE_TIMEOUT:-90}
device=unknown

say() { echo "gpu-k8s-data-check: $*"; }
# <3>: an error in the journal (systemd reads the priority prefix from the unit's output)
alarm() { echo "<3>gpu-k8s-data-check: $*"; }

json_text() { printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g'; }

# STATE DETAIL: this boot's verdict, then the exit status that goes with it.
verdict() {
    mkdir -p "$(dirname "$state_file")"
    printf '{"state": "%s", "device": "%s", "detail": "%s", "time": "%s"}\n' "$1" "$(json_text "$device")" \
        "$(json_text "$2")" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$state_file.tmp"
    mv "$state_file.tmp" "$state_file"
    case "$1" in
        ok|repaired) say "$2"; exit 0 ;;
        recreated) alarm "$2"; exit 0 ;;
        *) alarm "$2"; exit 1 ;;
    esac
}

is_mounted() {
    awk -v path="$1" '$5 == path { found = 1 } END { exit !found }' "$mountinfo"
}

# The /data line of fstab: "SPEC TYPE".
data_line() {
    awk '$1 !~ /^#/ && $2 == "/data" { print $1, $3; exit }' "$fstab" 2>/dev/null
}

# The device node a fstab spec names (udev's links for the tag forms).
device_of() {
    case "$1" in
        PARTUUID=*) echo "/dev/disk/by-partuuid/${1#PARTUUID=}" ;;
        PARTLABEL=*) echo "/dev/disk/by-partlabel/${1#PARTLABEL=}" ;;
        LABEL=*) echo "/dev/disk/by-label/${1#LABEL=}" ;;
        UUID=*) echo "/dev/disk/by-uuid/${1#UUID=}" ;;
        /dev/*) echo "$1" ;;
        *) return 1 ;;
    esac
}

# Its GPT partition name, as the kernel reports it.
partition_name() {
    name=$(basename "$(readlink -f "$root$1")")
    sed -n 's/^PARTNAME=//p' "$root/sys/class/block/$name/uevent" 2>/dev/null
}

trial_mount() {
    mkdir -p "$probe_dir"
    mount -t "$mkfs_type" "$root$device" "$probe_dir" || return 1
    umount "$probe_dir"
}

if is_mounted /data; then
    say "/data is already mounted: nothing to check"
    exit 0
fi
line=$(data_line)
[ -n "$line" ] || verdict unavailable "/etc/fstab has no /data line: nothing to check, nothing mounts /data"
spec=${line% *}
fstype=${line#* }
device=$(device_of "$spec") || verdict unavailable "cannot tell which device /etc/fstab's '$spec' is: left alone"
case "$mkfs_type" in
    ext2|ext3|ext4) ;;
    *) verdict ok "/data is $mkfs_type, which this check does not know: left to the mount" ;;
esac
case "$fstype" in
    auto|"$mkfs_type") ;;
    *) verdict unavailable "/etc/fstab mounts /data as $fstype, the image made it $mkfs_type: left alone" ;;
esac

waited=0
while [ ! -e "$root$device" ] && [ "$waited" -lt "$timeout" ]; do
    sleep 1
    waited=$((waited + 1))
done
[ -e "$root$device" ] || verdict unavailable "$device did not appear within ${timeout}s: /data stays unmounted this boot"
if [ ! -b "$root$device" ] && { [ -z "$root" ] || [ ! -f "$root$device" ]; }; then
    verdict unavailable "$device is not a block device: left alone"
fi
if [ -n "$partname" ]; then
    found_name=$(partition_name "$device")
    [ "$found_name" = "$partname" ] || verdict unavailable \
        "$device is partition '${found_name:-unnamed}', not the data partition '$partname': left alone (is the flash layout the image's?)"
fi

# Another kind of file system is not ours to check or to replace.
found_type=$(blkid -p -s TYPE -o value "$root$device" 2>/dev/null)
case "$found_type" in
    ''|ext2|ext3|ext4) ;;
    *) verdict unavailable "$device holds a $found_type file system, not the data partition's $mkfs_type: left alone" ;;
esac

# Ours, or nothing anyone can read: e2fsck first (it also finds a file system whose primary
# superblock is gone, from its backups), a new file system only when it gives up.
repaired=""
e2fsck -p "$root$device"
rc=$?
if [ "$rc" -ge 4 ]; then
    say "e2fsck -p left errors (exit $rc): checking again, fixing everything it finds"
    e2fsck -f -y "$root$device"
    rc=$?
    repaired="e2fsck -fy fixed it"
elif [ "$rc" -ge 1 ]; then
    repaired="e2fsck -p fixed it"
fi
if [ "$rc" -lt 4 ] && trial_mount; then
    [ -n "$repaired" ] && verdict repaired "$device had errors; $repaired (exit $rc), /data mounts"
    verdict ok "$device is clean"
fi
if [ "$rc" -lt 4 ]; then
    why="$device passed e2fsck but does not mount"
elif [ -z "$found_type" ]; then
    why="$device holds no file system e2fsck can find (exit $rc)"
else
    why="$device has a file system e2fsck cannot repair (exit $rc)"
fi

# Lost. Make a new one, as the image made it, with the old UUID where it can still be read.
uuid=$(blkid -p -s UUID -o value "$root$device" 2>/dev/null)
alarm "$why: making a new $mkfs_type file system labelled '$label' on it"
if ! "mkfs.$mkfs_type" -F -q -L "$label" ${uuid:+-U "$uuid"} "$root$device"; then
    verdict unavailable "$why, and mkfs.$mkfs_type failed on it: /data stays unmounted this boot"
fi
trial_mount || verdict unavailable "$why; a new file system on it does not mount either: /data stays unmounted this boot"
verdict recreated "$why: made a new one. Everything on /data is gone: docker images, k3s state and the node's provisioning (provision it again: docs/fleet.md)"
