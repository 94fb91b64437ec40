#!/bin/sh
# Import the preloaded rootfs into docker under the names k3s and the smoke test use.
# Idempotent: an image that is already present is left alone.
set -eu

tarball=@DATADIR@/gpu-k8s/images/gpu-k8s-smoke.tar.bz2

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

import_image localhost/gpu-k8s-smoke:latest 'CMD ["/bin/sh"]'
# A sandbox holder that exits on SIGTERM (PID 1 ignores signals it has no handler for).
import_image localhost/gpu-k8s-pause:latest \
    'ENTRYPOINT ["/bin/sh", "-c", "trap \"exit 0\" TERM INT; while :; do sleep 3600 & wait $!; done"]'
