#!/bin/sh
# Put the images a rollout job needs into the node's container runtime before k3s starts, so
# an air-gapped node can be updated: the upgrade image (a busybox whose job runs
# `chroot /host gpu-k8s-update upgrade ...`) and, when the build carried them, the
# controller and kubectl images (a docker-archive).
# - docker mode ("docker: true"): k3s imports nothing itself, so docker import/load here;
# - k3s's containerd: k3s imports every tarball in agent/images/ when it starts.
# Idempotent. Paths can be moved for tests: K3S_CONFIG_DIR, K3S_DATA_DIR.
set -eu

images=@DATADIR@/gpu-k8s/images
upgrade_image=@UPGRADE_IMAGE@
config_dir=${K3S_CONFIG_DIR:-/etc/rancher/k3s}
k3s_images=${K3S_DATA_DIR:-/var/lib/rancher/k3s}/agent/images

say() { echo "gpu-k8s-fleet-images: $*"; }

k3s_uses_docker() {
    for file in "$config_dir/config.yaml" "$config_dir"/config.yaml.d/*.yaml; do
        [ -f "$file" ] || continue
        grep -Eq '^docker:[[:space:]]*true[[:space:]]*$' "$file" && return 0
    done
    return 1
}

if docker image inspect "$upgrade_image" >/dev/null 2>&1; then
    say "$upgrade_image already present"
else
    docker import --change 'CMD ["/bin/sh"]' "$images/gpu-k8s-upgrade.tar.bz2" "$upgrade_image"
    say "imported $upgrade_image"
fi

if k3s_uses_docker; then
    for archive in "$images"/fleet/*.tar; do
        [ -e "$archive" ] || continue
        # a docker-archive names its images; loading what docker has is cheap
        docker load --input "$archive"
        say "loaded $archive into docker"
    done
else
    mkdir -p "$k3s_images"
    if [ ! -s "$k3s_images/gpu-k8s-upgrade.tar" ]; then
        docker save -o "$k3s_images/gpu-k8s-upgrade.tar.tmp" "$upgrade_image"
        mv "$k3s_images/gpu-k8s-upgrade.tar.tmp" "$k3s_images/gpu-k8s-upgrade.tar"
        say "saved $upgrade_image for k3s's containerd"
    fi
    for archive in "$images"/fleet/*.tar; do
        [ -e "$archive" ] || continue
        ln -sf "$archive" "$k3s_images/$(basename "$archive")"
        say "linked $archive into $k3s_images for k3s to import"
    done
fi
