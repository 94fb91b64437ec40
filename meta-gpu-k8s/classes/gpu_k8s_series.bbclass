# Inherited globally by conf/layer.conf: reads the one file that holds every difference
# between the Yocto series this layer serves, chosen by the core layer's series name. A series
# without a file here cannot get this far: LAYERSERIES_COMPAT_gpu-k8s rejects it first.
# nooelint: oelint.file.requirenotfound - both variables are known to bitbake only, not to the linter
require ${GPU_K8S_LAYERDIR}/conf/series/${LAYERSERIES_CORENAMES}.inc
