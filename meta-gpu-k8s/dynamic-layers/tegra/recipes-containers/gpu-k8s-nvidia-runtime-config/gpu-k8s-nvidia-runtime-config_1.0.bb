SUMMARY = "NVIDIA runtime settings for GPU Kubernetes nodes on Jetson (toolkit 1.19)"
DESCRIPTION = "A drop-in for meta-tegra's nvidia-container-setup.service: after the unit \
writes the runtime's configuration at boot, nvidia-ctk sets GPU isolation (NVIDIA_VISIBLE_DEVICES \
ignored from unprivileged containers, volume-mount requests accepted) and, on Orin and Thor, CSV mode; \
a unit that reads them back, which docker and k3s require, so neither starts without them."
HOMEPAGE = "https://github.com/meta-gpu-k8s/meta-gpu-k8s"
LICENSE = "MIT"
# nooelint: oelint.var.licenseremotefile - no upstream source: our own drop-in, MIT
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/MIT;md5=0835ade698e0bcf8506ecda2f7b4f302"

SRC_URI = "file://50-gpu-k8s-runtime.conf \
           file://gpu-k8s-nvidia-runtime-check.service \
           file://60-gpu-k8s-nvidia-runtime.conf \
"

S = "${UNPACKDIR}"

inherit gpu_k8s_platform

# meta-tegra wrynose's toolkit (1.19, with nvidia-ctk and the setup unit); the Nano's 1.0.5
# has neither, and no setting that isolates (docs/layer.md).
COMPATIBLE_MACHINE = "(tegra)"
COMPATIBLE_MACHINE:tegra210 = "(^$)"
PACKAGE_ARCH = "${MACHINE_ARCH}"

# nvidia-ctk --set arguments, from the knobs in classes/gpu_k8s_platform.bbclass.
GPU_K8S_RUNTIME_SETTINGS = " \
    --set accept-nvidia-visible-devices-envvar-when-unprivileged=${@'true' if d.getVar('GPU_K8S_GPU_ISOLATION') == '0' else 'false'} \
    --set accept-nvidia-visible-devices-as-volume-mounts=true \
    ${@'--set nvidia-container-runtime.mode=' + d.getVar('GPU_K8S_NVIDIA_RUNTIME_MODE') if d.getVar('GPU_K8S_NVIDIA_RUNTIME_MODE') else ''} \
"

# The units that run containers through the NVIDIA runtime: each requires the check (the
# drop-in of one that is not installed, docker in containerd mode, is never read).
GPU_K8S_RUNTIME_USERS = "docker.service k3s.service k3s-agent.service"

do_install() {
    dir=${D}${systemd_system_unitdir}/${GPU_K8S_NVIDIA_SETUP_UNIT}.d
    install -d $dir
    install -m 0644 ${UNPACKDIR}/50-gpu-k8s-runtime.conf $dir/
    sed -i -e 's#@BINDIR@#${bindir}#g' -e "s#@SETTINGS@#$(echo ${GPU_K8S_RUNTIME_SETTINGS})#g" \
        $dir/50-gpu-k8s-runtime.conf

    # the same settings, read back: --set KEY=VALUE becomes --expect KEY=VALUE
    expect="$(echo ${GPU_K8S_RUNTIME_SETTINGS} | sed -e 's/--set /--expect /g')"
    install -m 0644 ${UNPACKDIR}/gpu-k8s-nvidia-runtime-check.service ${D}${systemd_system_unitdir}/
    sed -i -e 's#@BINDIR@#${bindir}#g' -e 's#@SETUP_UNIT@#${GPU_K8S_NVIDIA_SETUP_UNIT}#g' -e "s#@EXPECT@#$expect#g" \
        ${D}${systemd_system_unitdir}/gpu-k8s-nvidia-runtime-check.service
    for unit in ${GPU_K8S_RUNTIME_USERS}; do
        install -d ${D}${systemd_system_unitdir}/$unit.d
        install -m 0644 ${UNPACKDIR}/60-gpu-k8s-nvidia-runtime.conf ${D}${systemd_system_unitdir}/$unit.d/
    done
}

FILES:${PN} += "${systemd_system_unitdir}"

# The unit and nvidia-ctk it extends; the plugin's command reads the settings back.
RDEPENDS:${PN} = "gpu-device-plugin nvidia-container-toolkit"

# nooelint: oelint.task.noanonpython - a wrong knob must stop the parse, not build a node without isolation
python () {
    for var, allowed in (('GPU_K8S_GPU_ISOLATION', ('0', '1')),
                         ('GPU_K8S_NVIDIA_RUNTIME_MODE', ('', 'auto', 'csv', 'cdi', 'jit-cdi', 'legacy'))):
        value = d.getVar(var) or ''
        if value not in allowed:
            bb.fatal('%s must be one of %s, got "%s" (set it in local.conf)'
                     % (var, ', '.join(v or '""' for v in allowed), value))
}
