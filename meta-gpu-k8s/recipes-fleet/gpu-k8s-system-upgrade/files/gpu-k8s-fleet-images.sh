#!/bin/sh
# Put the images a rollout job needs into docker before k3s starts, so an air-gapped node
# can be updated: the upgrade image (a busybox whose job runs `chroot /host gpu-k8s-update
# upgrade ...`) and, when the build carried them, the controller and kubectl images.
# k3s in docker mode does not import its airgap images directory, hence docker load here.
# Idempotent: what docker already has is left alone.
set -eu

images=@DATADIR@/gpu-k8s/images
upgrade_image=@UPGRADE_IMAGE@

if docker image inspect "$upgrade_image" >/dev/null 2>&1; then
    echo "gpu-k8s-fleet-images: $upgrade_image already present"
else
    docker import --change 'CMD ["/bin/sh"]' "$images/gpu-k8s-upgrade.tar.bz2" "$upgrade_image"
    echo "gpu-k8s-fleet-images: imported $upgrade_image"
fi

for archive in "$images"/fleet/*.tar; do
    [ -e "$archive" ] || continue
    # a docker-archive names its images; load is cheap when they are already there
    docker load --input "$archive"
    echo "gpu-k8s-fleet-images: loaded $archive"
done
