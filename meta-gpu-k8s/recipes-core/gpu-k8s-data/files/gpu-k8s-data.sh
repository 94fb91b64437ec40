#!/bin/sh
# Bind node state from the data partition over its place in the root filesystem, so that
# docker, containerd, k3s, the kubelet, network settings and the node identity survive an
# A/B slot switch, and link the files that provision or identify the node (k3s config.yaml
# and token, settings files, SSH host keys) to their kept copies. Idempotent: a path that is
# already a mount point is left alone.
#   gpu-k8s-data           at boot: binds and links, and files what gpu-k8s-data-check did
#                          to the data partition in this boot in its log on /data
#   gpu-k8s-data --adopt   at shutdown (ExecStop): keep provisioning files written on this
#                          slot since boot, before a reboot into another slot drops them
# GPU_K8S_ROOT prefixes every path (tests).
set -eu

root=${GPU_K8S_ROOT:-}
list=${GPU_K8S_PERSIST_LIST:-@DATADIR@/gpu-k8s/persist.list}
files_list=${GPU_K8S_NODE_CONFIG_LIST:-@DATADIR@/gpu-k8s/node-config.list}
data=${GPU_K8S_DATA_DIR:-/data/gpu-k8s}
mountinfo=${GPU_K8S_MOUNTINFO:-/proc/self/mountinfo}
check_state=${GPU_K8S_DATA_STATE:-/run/gpu-k8s/data-state.json}
mode=boot
[ "${1:-}" = "--adopt" ] && mode=adopt

say() { echo "gpu-k8s-data: $*"; }

# The link from PATH to its kept copy, relative (../../data/...): it resolves the same on
# the board and under a root prefix.
link_to() {
    printf '%s%s' "$(dirname "$1" | sed -e 's#^/##' -e 's#[^/][^/]*#..#g')" "$2"
}

# Move a provisioning file from the root slot to its kept copy (atomically, by rename within
# /data) and link it back.
adopt() {
    path=$1 kept=$2
    cp -p "$root$path" "$root$kept.new" && mv "$root$kept.new" "$root$kept" \
        && rm -f "$root$path" && ln -s "$(link_to "$path" "$kept")" "$root$path"
}

# One provisioning or identity file. The kept copy, when there is one, is the truth; a
# regular file at PATH was written on this slot (the image ships none, except "image"
# defaults; for "identity" files it was made while /data was away, and the kept one wins).
keep_file() {
    name=$1 path=$2 flag=$3
    dir=$data/node-config
    kept=$dir/$name
    image_copy=$dir/.image/$name
    target=$root$path
    link=$(link_to "$path" "$kept")
    mkdir -p "$root$dir/.image"
    if [ -L "$target" ]; then
        if [ "$(readlink "$target")" != "$link" ]; then
            say "$path links elsewhere ($(readlink "$target")): left alone, not kept across updates"
        fi
        return 0
    fi
    if [ -f "$target" ] && [ ! -e "$root$kept" ]; then
        [ "$flag" = image ] && cp -p "$target" "$root$image_copy"
        adopt "$path" "$kept"
        say "kept $path in $kept"
    elif [ -f "$target" ] && [ "$flag" = identity ]; then
        rm -f "$target"
        ln -s "$link" "$target"
        say "$path: the one this slot made while $data was away replaced by the kept $kept"
    elif [ -f "$target" ] && [ "$flag" = image ] && [ -f "$root$image_copy" ] \
            && cmp -s "$target" "$root$image_copy"; then
        rm -f "$target"
        ln -s "$link" "$target"
    elif [ -f "$target" ] && [ "$flag" = image ] && [ "$mode" = boot ]; then
        # A new image default. It replaces the kept copy only if that was never changed.
        if [ -f "$root$image_copy" ] && cmp -s "$root$kept" "$root$image_copy"; then
            cp -p "$target" "$root$image_copy"
            adopt "$path" "$kept"
            say "$path: took the new image's default (the kept copy was never changed)"
        else
            cp -p "$target" "$root$image_copy"
            rm -f "$target"
            ln -s "$link" "$target"
            say "$path: kept your copy; the new image's default is in $image_copy"
        fi
    elif [ -f "$target" ]; then
        # Written on this slot by a tool that replaced the link (sed -i, an editor): newer.
        adopt "$path" "$kept"
        say "kept the $path written on this slot in $kept"
    elif [ ! -e "$target" ] && [ -e "$root$kept" ] && [ "$mode" = boot ]; then
        mkdir -p "$(dirname "$target")"
        ln -s "$link" "$target"
        say "linked $path to $kept"
    fi
}

keep_files() {
    [ -f "$files_list" ] || return 0
    while read -r name path flag rest; do
        case "$name" in ''|'#'*) continue ;; esac
        if [ -z "$path" ] || [ -n "$rest" ] || { [ -n "$flag" ] && [ "$flag" != image ] && [ "$flag" != identity ]; }; then
            say "bad line in $files_list: '$name $path $flag $rest' (want: NAME PATH [image|identity])" >&2
            status=1
            continue
        fi
        keep_file "$name" "$path" "$flag" || status=1
    done < "$files_list"
}

is_mount_point() {
    # field 5 of mountinfo is the mount point
    awk -v path="$1" '$5 == path { found = 1 } END { exit !found }' "$mountinfo"
}

if ! is_mount_point /data; then
    say "/data is not mounted: refusing to keep node state on the root slot, where the next update would lose it" >&2
    exit 1
fi

# What gpu-k8s-data-check did to the data partition in this boot, kept on it: a repair,
# or a new file system made in place of a lost one (the node's state and provisioning
# went with it). Once per boot: the line carries the boot's id.
record_check() {
    [ -f "$check_state" ] || return 0
    line=$(tr -d '\n' < "$check_state")
    case "$line" in *'"state": "ok"'*|'') return 0 ;; esac
    events=$root$data/data-events.log
    boot=$(cat "${GPU_K8S_BOOT_ID:-/proc/sys/kernel/random/boot_id}" 2>/dev/null || echo unknown)
    grep -qF "\"boot_id\": \"$boot\"" "$events" 2>/dev/null && return 0
    mkdir -p "$(dirname "$events")"
    printf '{"boot_id": "%s", "check": %s}\n' "$boot" "$line" >> "$events"
    say "filed this boot's data partition check in $data/data-events.log: $line"
}

status=0
if [ "$mode" = adopt ]; then
    keep_files
    exit $status
fi
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
keep_files
record_check
exit $status
