SUMMARY = "GPU-ready Kubernetes node image: k3s on docker with the GPU device plugin"
DESCRIPTION = "Boots as a k3s node whose GPU pods request nvidia.com/gpu. Production \
defaults: root has no password (locked) and ssh refuses empty passwords; use \
gpu-k8s-image-dev for a debug image with root login."
HOMEPAGE = "https://github.com/meta-gpu-k8s/meta-gpu-k8s"
LICENSE = "MIT"

require gpu-k8s-image.inc
