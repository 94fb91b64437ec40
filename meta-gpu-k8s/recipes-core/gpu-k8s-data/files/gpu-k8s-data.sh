#!/bin/sh
# Bind node state from the data partition over its place in the root filesystem, so that
# docker, k3s and the node identity survive an A/B slot switch. Idempotent: a path that is
# already a mount point is left alone. GPU_K8S_ROOT prefixes every path (tests).
set -eu

root=${GPU_K8S_ROOT:-}
list=${GPU_K8S_PERSIST_LIST:-@DATADIR@/gpu-k8s/persist.list}
data=${GPU_K8S_DATA_DIR:-/data/gpu-k8s}
mountinfo=${GPU_K8S_MOUNTINFO:-/proc/self/mountinfo}

say() { echo "gpu-k8s-data: $*"; }

is_mount_point() {
    # field 5 of mountinfo is the mount point
    awk -v path="$1" '$5 == path { found = 1 } END { exit !found }' "$mountinfo"
}

if ! is_mount_point /data; then
    say "/data is not mounted: refusing to keep node state on the root slot, where the next update would lose it" >&2
    exit 1
fi

status=0
while read -r name path rest; do
    case "$name" in ''|'#'*) continue ;; esac
    if [ -z "$path" ] || [ -n "$rest" ]; then
        say "bad line in $list: '$name $path $rest' (want: NAME PATH)" >&2
        status=1
        continue
    fi
    source_dir=$root$data/$name
    target=$root$path
    if is_mount_point "$path"; then
        say "$path already bound"
        continue
    fi
    if [ ! -d "$source_dir" ]; then
        # First boot on this data partition: start from what the image ships. Copy to a
        # temporary name and rename, so a copy cut short by a power loss is done again.
        rm -rf "$source_dir.new"
        mkdir -p "$source_dir.new"
        if [ -d "$target" ]; then
            cp -a "$target/." "$source_dir.new/"
        fi
        mv "$source_dir.new" "$source_dir"
        say "seeded $data/$name from $path"
    fi
    mkdir -p "$target"
    if mount --bind "$source_dir" "$target"; then
        say "bound $data/$name on $path"
    else
        say "could not bind $data/$name on $path" >&2
        status=1
    fi
done < "$list"
exit $status
