SUMMARY = "NVIDIA Container Toolkit: nvidia-ctk, CDI hook, NVIDIA runtime (CDI modes)"
DESCRIPTION = "Built from source for x86-64 discrete GPUs: nvidia-ctk generates the CDI spec \
of the node's GPUs (gpu-k8s-nvidia-cdi runs it at boot), nvidia-container-runtime wraps runc \
and adds to a container the devices and driver libraries of the GPUs it was allocated (mode \
auto: built from NVML per container, or from that spec for CDI names), ignoring \
NVIDIA_VISIBLE_DEVICES from unprivileged containers; nvidia-cdi-hook does the in-container \
steps (ldcache, symlinks). No libnvidia-container needed. 1.17.8 and later fix CVE-2025-23266."
HOMEPAGE = "https://github.com/NVIDIA/nvidia-container-toolkit"
LICENSE = "Apache-2.0 & MIT & BSD-2-Clause & BSD-3-Clause & ISC & MPL-2.0"
LIC_FILES_CHKSUM = " \
    file://src/${GO_IMPORT}/LICENSE;md5=3b83ef96387f14655fc854ddc3c6bd57 \
    file://src/${GO_IMPORT}/vendor/cyphar.com/go-pathrs/COPYING;md5=f75d2927d3c1ed2414ef72048f5ad640 \
    file://src/${GO_IMPORT}/vendor/github.com/Masterminds/semver/v3/LICENSE.txt;md5=4c1ffeeb02e3f8f4af042205e189b3f7 \
    file://src/${GO_IMPORT}/vendor/github.com/NVIDIA/go-nvlib/LICENSE;md5=3b83ef96387f14655fc854ddc3c6bd57 \
    file://src/${GO_IMPORT}/vendor/github.com/NVIDIA/go-nvml/LICENSE;md5=3b83ef96387f14655fc854ddc3c6bd57 \
    file://src/${GO_IMPORT}/vendor/github.com/containerd/log/LICENSE;md5=1269f40c0d099c21a871163984590d89 \
    file://src/${GO_IMPORT}/vendor/github.com/containerd/nri/LICENSE;md5=86d3f3a95c324c9479bd8986968f4327 \
    file://src/${GO_IMPORT}/vendor/github.com/containerd/ttrpc/LICENSE;md5=86d3f3a95c324c9479bd8986968f4327 \
    file://src/${GO_IMPORT}/vendor/github.com/davecgh/go-spew/LICENSE;md5=c06795ed54b2a35ebeeb543cd3a73e56 \
    file://src/${GO_IMPORT}/vendor/github.com/fsnotify/fsnotify/LICENSE;md5=8bae8b116e2cfd723492b02d9a212fe2 \
    file://src/${GO_IMPORT}/vendor/github.com/google/uuid/LICENSE;md5=88073b6dd8ec00fe09da59e0b6dfded1 \
    file://src/${GO_IMPORT}/vendor/github.com/knqyf263/go-plugin/LICENSE;md5=2dc23388424fc3c35642b2b8dde0c2a9 \
    file://src/${GO_IMPORT}/vendor/github.com/moby/sys/capability/LICENSE;md5=9fb69cc4971ab0f8fd79631959bf0616 \
    file://src/${GO_IMPORT}/vendor/github.com/moby/sys/mountinfo/LICENSE;md5=3b83ef96387f14655fc854ddc3c6bd57 \
    file://src/${GO_IMPORT}/vendor/github.com/opencontainers/cgroups/LICENSE;md5=e3fc50a88d0a364313df4b21ef20c29e \
    file://src/${GO_IMPORT}/vendor/github.com/opencontainers/runc/LICENSE;md5=435b266b3899aa8a959f17d41c56def8 \
    file://src/${GO_IMPORT}/vendor/github.com/opencontainers/runtime-spec/LICENSE;md5=b355a61a394a504dacde901c958f662c \
    file://src/${GO_IMPORT}/vendor/github.com/pelletier/go-toml/LICENSE;md5=e49b63d868761700c5df76e7946d0bd7 \
    file://src/${GO_IMPORT}/vendor/github.com/pmezard/go-difflib/LICENSE;md5=e9a2ebb8de779a07500ddecca806145e \
    file://src/${GO_IMPORT}/vendor/github.com/prometheus/procfs/LICENSE;md5=86d3f3a95c324c9479bd8986968f4327 \
    file://src/${GO_IMPORT}/vendor/github.com/sirupsen/logrus/LICENSE;md5=8dadfef729c08ec4e631c4f6fc5d43a0 \
    file://src/${GO_IMPORT}/vendor/github.com/tetratelabs/wazero/LICENSE;md5=a80aae5626b7e957ac00f5d22276ac9e \
    file://src/${GO_IMPORT}/vendor/github.com/urfave/cli-altsrc/v3/LICENSE;md5=e0fece35c345496f4104ae206730a4a7 \
    file://src/${GO_IMPORT}/vendor/github.com/urfave/cli/v3/LICENSE;md5=d3cbe340ccb16f5dfd0159218588a222 \
    file://src/${GO_IMPORT}/vendor/golang.org/x/mod/LICENSE;md5=7998cb338f82d15c0eff93b7004d272a \
    file://src/${GO_IMPORT}/vendor/golang.org/x/sys/LICENSE;md5=7998cb338f82d15c0eff93b7004d272a \
    file://src/${GO_IMPORT}/vendor/google.golang.org/grpc/LICENSE;md5=3b83ef96387f14655fc854ddc3c6bd57 \
    file://src/${GO_IMPORT}/vendor/google.golang.org/protobuf/LICENSE;md5=02d4002e9171d41a8fad93aa7faf3956 \
    file://src/${GO_IMPORT}/vendor/gopkg.in/yaml.v3/LICENSE;md5=3c91c17266710e16afdbb2b6d15c761c \
    file://src/${GO_IMPORT}/vendor/sigs.k8s.io/yaml/LICENSE;md5=b5d30dd5bc47d1b56b678ac06dead1c7 \
    file://src/${GO_IMPORT}/vendor/tags.cncf.io/container-device-interface/LICENSE;md5=86d3f3a95c324c9479bd8986968f4327 \
"

# Tag v1.20.0 (branch release-1.20). Its go modules are vendored in the repository, so the
# build fetches nothing else.
SRC_URI = "git://github.com/NVIDIA/nvidia-container-toolkit.git;protocol=https;branch=release-1.20;destsuffix=${GO_SRCURI_DESTSUFFIX} \
           file://config.toml \
"
SRCREV = "5505e2f94d9aaa08561490db974ba3cd676af209"

inherit go-mod gpu_k8s_nvidia gpu_k8s_platform

GO_IMPORT = "github.com/NVIDIA/nvidia-container-toolkit"
# CDI and jit-CDI modes only: the legacy hook (nvidia-container-runtime-hook) would need libnvidia-container,
# the installer (nvidia-ctk-installer) is for the GPU Operator's containers.
GO_INSTALL = " \
    ${GO_IMPORT}/cmd/nvidia-ctk \
    ${GO_IMPORT}/cmd/nvidia-cdi-hook \
    ${GO_IMPORT}/cmd/nvidia-container-runtime \
"
GO_EXTRA_LDFLAGS:append = " \
    -X ${GO_IMPORT}/internal/info.version=${PV} \
    -X ${GO_IMPORT}/internal/info.gitCommit=${SRCREV} \
"
# go-nvml looks NVML's symbols up when called: it needs lazy binding, and no -linkshared.
SECURITY_LDFLAGS = ""
LDFLAGS += "-Wl,-z,lazy"
GO_LINKSHARED = ""

# The userspace it discovers GPUs through is x86-64 only (nvidia-driver).
COMPATIBLE_HOST = "x86_64.*-linux"

# go.mod of v1.20.0 asks for Go 1.25 (GPU_K8S_NVIDIA_MIN_GO): a series that pins an older Go
# skips the recipe, saying so.
# nooelint: oelint.task.noanonpython - an older Go must skip the recipe with the reason, not fail in do_compile
python () {
    go = gpu_k8s_nvidia_old_go(d)
    if go:
        raise bb.parse.SkipRecipe('nvidia-container-toolkit %s needs Go >= %s, this series has Go %s'
                                  % (d.getVar('PV'), d.getVar('GPU_K8S_NVIDIA_MIN_GO'), go))
}

do_install:append() {
    install -d ${D}${sysconfdir}/nvidia-container-runtime
    install -m 0644 ${UNPACKDIR}/config.toml ${D}${sysconfdir}/nvidia-container-runtime/config.toml
    # GPU_K8S_GPU_ISOLATION = "0" (classes/gpu_k8s_platform.bbclass): the toolkit's default back
    if [ "${GPU_K8S_GPU_ISOLATION}" = "0" ]; then
        sed -i -e 's/^accept-nvidia-visible-devices-envvar-when-unprivileged = false$/accept-nvidia-visible-devices-envvar-when-unprivileged = true/' \
            ${D}${sysconfdir}/nvidia-container-runtime/config.toml
    fi
}

CONFFILES:${PN} = "${sysconfdir}/nvidia-container-runtime/config.toml"

# The CDI hook runs the host's ldconfig (config default "@/sbin/ldconfig") to update a
# container's library cache.
RDEPENDS:${PN} = "ldconfig"
# go_do_install copies the source tree into -dev; its scripts need these.
RDEPENDS:${PN}-dev += "bash make"
