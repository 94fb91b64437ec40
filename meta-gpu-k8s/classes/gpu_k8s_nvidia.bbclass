# The x86-64 NVIDIA discrete-GPU stack: NVIDIA's open kernel modules and the same-version
# driver userspace (recipes-kernel/nvidia-open-gpu-kernel-modules, recipes-graphics/nvidia-driver),
# the container toolkit in CDI mode, the boot-time CDI spec (gpu-k8s-nvidia-cdi) and the NVML
# Python bindings for the device plugin.
#
# GPU_K8S_NVIDIA = "1" puts it in the image, "0" leaves it out. Default: on for x86-64
# machines with the layer's distro feature (gpu-k8s; without it adding the layer changes
# nothing, so a build that merely adds the layer is never stopped), off for QEMU (no GPU there; set "1" to prove a GPU-less VM still comes up) and
# Jetson (its GPU stack is meta-tegra's), and off where the series' Go cannot build the
# toolkit. The driver's licence is NVIDIA's: with "1" the build needs
# LICENSE_FLAGS_ACCEPTED += "nvidia-driver" (kas/include/nvidia-licence.yml), checked at parse
# time by packagegroup-gpu-k8s.

# go.mod of nvidia-container-toolkit 1.20.0 asks for Go 1.25.
GPU_K8S_NVIDIA_MIN_GO = "1.25"

def gpu_k8s_nvidia_old_go(d):
    """The series' Go when it is older than the toolkit needs, else ''. Series with several
    Go versions pin one with GOVERSION (scarthgap 1.22%, kirkstone 1.17%); wrynose has a
    single Go (1.26) and no GOVERSION."""
    go = (d.getVar('GOVERSION') or '').rstrip('%')
    if go and bb.utils.vercmp_string_op(go, d.getVar('GPU_K8S_NVIDIA_MIN_GO'), '<'):
        return go
    return ''

def gpu_k8s_nvidia_default(d):
    overrides = (d.getVar('MACHINEOVERRIDES') or '').split(':')
    if d.getVar('TARGET_ARCH') != 'x86_64' or 'qemuall' in overrides:
        return '0'
    if 'gpu-k8s' not in (d.getVar('DISTRO_FEATURES') or '').split():
        return '0'
    return '0' if gpu_k8s_nvidia_old_go(d) else '1'

GPU_K8S_NVIDIA ??= "${@gpu_k8s_nvidia_default(d)}"

# The LICENSE_FLAGS of the nvidia-driver recipe.
GPU_K8S_NVIDIA_LICENSE_FLAG = "nvidia-driver"

def gpu_k8s_nvidia_licence_accepted(d):
    # bitbake's rule (oe.license.check_license_flags) for flag "nvidia-driver" of recipe
    # nvidia-driver: the flag itself, or the flag with the recipe name appended.
    flag = d.getVar('GPU_K8S_NVIDIA_LICENSE_FLAG')
    accepted = (d.getVar('LICENSE_FLAGS_ACCEPTED') or '').split()
    return flag in accepted or flag + '_nvidia-driver' in accepted

# Fabric Manager (NVSwitch systems): in the image when its archive of the driver's version is
# pinned (NVIDIA_FABRICMANAGER_SHA256 and _LICENSE_MD5 in nvidia-driver-version.inc, which the
# packagegroup requires), as it is for the data-centre release pinned there, so it is on by
# default; its unit starts only where an NVSwitch is found, so it costs nothing elsewhere. "0"
# leaves it out; "1" without the pins (a driver moved to a release without a Fabric Manager
# archive) stops the parse, naming them.
def gpu_k8s_nvidia_fabricmanager_pinned(d):
    return bool(d.getVar('NVIDIA_FABRICMANAGER_SHA256') and d.getVar('NVIDIA_FABRICMANAGER_LICENSE_MD5'))

GPU_K8S_NVIDIA_FABRICMANAGER ??= "${@'1' if gpu_k8s_nvidia_fabricmanager_pinned(d) else '0'}"

def gpu_k8s_nvidia_problem(d):
    """Why GPU_K8S_NVIDIA cannot be built as set, in one line with the fix; '' if it can."""
    value = d.getVar('GPU_K8S_NVIDIA')
    if value not in ('0', '1'):
        return 'GPU_K8S_NVIDIA must be "0" or "1", got "%s" (set it in local.conf)' % value
    if value == '0':
        return ''
    if d.getVar('TARGET_ARCH') != 'x86_64':
        return ('GPU_K8S_NVIDIA = "1" is for x86-64 machines (NVIDIA publishes this driver userspace for x86-64 only); '
                'this MACHINE is %s: set GPU_K8S_NVIDIA = "0"' % d.getVar('TARGET_ARCH'))
    go = gpu_k8s_nvidia_old_go(d)
    if go:
        return ('GPU_K8S_NVIDIA = "1" needs nvidia-container-toolkit 1.20.0, built with Go >= %s; this series has Go %s '
                '(build x86-64 on wrynose, or set GPU_K8S_NVIDIA = "0")' % (d.getVar('GPU_K8S_NVIDIA_MIN_GO'), go))
    fabricmanager = d.getVar('GPU_K8S_NVIDIA_FABRICMANAGER')
    if fabricmanager not in ('0', '1'):
        return 'GPU_K8S_NVIDIA_FABRICMANAGER must be "0" or "1", got "%s" (set it in local.conf)' % fabricmanager
    if fabricmanager == '1' and not gpu_k8s_nvidia_fabricmanager_pinned(d):
        return ('GPU_K8S_NVIDIA_FABRICMANAGER = "1" but Fabric Manager %s is not pinned: set NVIDIA_FABRICMANAGER_SHA256 '
                '(from NVIDIA\'s redistrib_%s.json) and NVIDIA_FABRICMANAGER_LICENSE_MD5, or set '
                'GPU_K8S_NVIDIA_FABRICMANAGER = "0"' % (d.getVar('NVIDIA_DRIVER_VERSION'), d.getVar('NVIDIA_DRIVER_VERSION')))
    if not gpu_k8s_nvidia_licence_accepted(d):
        return ('the NVIDIA driver licence is not accepted: the image carries NVIDIA\'s driver (GPU_K8S_NVIDIA = "1"), '
                'redistributable only under its licence (https://www.nvidia.com/en-us/drivers/nvidia-license/); '
                'to accept it add kas/include/nvidia-licence.yml to the kas command or set '
                'LICENSE_FLAGS_ACCEPTED += "nvidia-driver" in local.conf; GPU_K8S_NVIDIA = "0" builds without GPU support')
    return ''
