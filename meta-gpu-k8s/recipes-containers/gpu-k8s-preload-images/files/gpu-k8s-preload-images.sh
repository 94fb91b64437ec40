#!/bin/sh
# Import the preloaded rootfs into docker under the names k3s and the smoke test use.
# Idempotent: an image that is already present is left alone.
# When k3s runs its own containerd (no "docker: true" in its config), the images are also
# saved into k3s's agent/images/, which k3s imports when it starts.
set -eu

tarball=@DATADIR@/gpu-k8s/images/gpu-k8s-smoke.tar.bz2
config_dir=${K3S_CONFIG_DIR:-/etc/rancher/k3s}
images_dir=${K3S_DATA_DIR:-/var/lib/rancher/k3s}/agent/images
smoke=localhost/gpu-k8s-smoke:latest
pause=localhost/gpu-k8s-pause:latest

import_image() {
    tag=$1
    change=$2
    if docker image inspect "$tag" >/dev/null 2>&1; then
        echo "gpu-k8s-preload-images: $tag already present"
        return 0
    fi
    docker import --change "$change" "$tarball" "$tag"
    echo "gpu-k8s-preload-images: imported $tag"
}

k3s_uses_docker() {
    for file in "$config_dir/config.yaml" "$config_dir"/config.yaml.d/*.yaml; do
        [ -f "$file" ] || continue
        grep -Eq '^docker:[[:space:]]*true[[:space:]]*$' "$file" && return 0
    done
    return 1
}

import_image "$smoke" 'CMD ["/bin/sh"]'
# A sandbox holder that exits on SIGTERM (PID 1 ignores signals it has no handler for).
import_image "$pause" \
    'ENTRYPOINT ["/bin/sh", "-c", "trap \"exit 0\" TERM INT; while :; do sleep 3600 & wait $!; done"]'

if ! k3s_uses_docker; then
    archive=$images_dir/gpu-k8s-preload.tar
    if [ ! -s "$archive" ]; then
        mkdir -p "$images_dir"
        docker save -o "$archive.tmp" "$smoke" "$pause"
        mv "$archive.tmp" "$archive"
        echo "gpu-k8s-preload-images: saved $smoke and $pause for k3s's containerd ($archive)"
    fi
fi
