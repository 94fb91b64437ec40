# Inherited by our tegra-storage-layout-base bbappend (dynamic-layers/mender-tegra) only with
# the A/B class: the Jetson Orin's and Thor's flash layouts get a data partition from the first flash.
# NVIDIA's layouts give user data only UDA, 400 MiB ahead of the rootfs slots (it can never
# grow, and NVIDIA reserves it for its own OTA); this appends GPU_K8S_TEGRA_DATA_PARTNAME right
# after APP_b, filling the rest of the device, with the Mender data image (DATAFILE) on it and
# on nothing else. lib/gpu_k8s/tegra_layout.py does the edit; here it is applied and checked.

# The name (spelled so) that meta-mender-tegra's own layouts append: a meta-mender-tegra that
# appends the same partition finds ours and leaves it, and the other way round (tegra_layout
# adopts it). NVIDIA's layouts have no such partition (t234 and t264 alike).
GPU_K8S_TEGRA_DATA_PARTNAME ?= "permanet_user_storage"
# The data image's size is only a floor: the partition fills the device, and mender-growfs-data
# grows the file system at first boot.
GPU_K8S_TEGRA_DATA_PART_BYTES = "${@int(d.getVar('MENDER_DATA_PART_SIZE_MB')) * 1024 * 1024}"

python gpu_k8s_mender_tegra_layout() {
    import os
    layout = gpu_k8s_lib(d, 'gpu_k8s.tegra_layout')
    name = d.getVar('GPU_K8S_TEGRA_DATA_PARTNAME')
    want = d.getVar('MENDER_DATA_PART_NUMBER')
    staged = os.path.join(d.getVar('D') + d.getVar('datadir'), 'l4t-storage-layout')
    placed = []
    for var in ('PARTITION_LAYOUT_TEMPLATE', 'PARTITION_LAYOUT_EXTERNAL'):
        fname = d.getVar(var)
        path = os.path.join(staged, fname or '')
        if not fname or not os.path.isfile(path):
            continue
        with open(path) as handle:
            text = handle.read()
        try:
            result = layout.place_data_partition(text, name, int(d.getVar('GPU_K8S_TEGRA_DATA_PART_BYTES')))
        except layout.LayoutError as error:
            bb.fatal('%s (%s): %s' % (fname, var, error))
        if result is None:
            bb.note('%s has no rootfs slots (a boot-device layout): no data partition there' % fname)
            continue
        if str(result.number) != want:
            bb.fatal('%s: the data partition %s is partition %d on its %s device, but MENDER_DATA_PART_NUMBER '
                     'is %s: fstab would mount the wrong partition at /data. Set MENDER_DATA_PART_NUMBER for '
                     'this machine to %d (classes/gpu_k8s_mender.bbclass)'
                     % (fname, name, result.number, result.device, want, result.number))
        with open(path, 'w') as handle:
            handle.write(result.text)
        placed.append(fname)
        bb.note('%s: %s %s as partition %d of the %s device' % (
            fname, 'appended' if result.appended else 'kept', name, result.number, result.device))
    if not placed:
        bb.fatal('no staged flash layout (%s, %s) has rootfs slots, so the data image has nowhere to go: '
                 'set USE_REDUNDANT_FLASH_LAYOUT_DEFAULT = "1" for this machine'
                 % (d.getVar('PARTITION_LAYOUT_TEMPLATE'), d.getVar('PARTITION_LAYOUT_EXTERNAL')))
}
# After do_install (and every bbappend's do_install:append, meta-mender-tegra's UDA rewrite
# among them), which is what stages the layouts.
do_install[postfuncs] += "gpu_k8s_mender_tegra_layout"
do_install[vardeps] += "GPU_K8S_TEGRA_DATA_PARTNAME GPU_K8S_TEGRA_DATA_PART_BYTES MENDER_DATA_PART_NUMBER"
