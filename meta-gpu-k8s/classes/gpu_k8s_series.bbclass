# Inherited globally by conf/layer.conf: reads the one file that holds every difference
# between the Yocto series this layer serves, chosen by the core layer's series name. A series
# without a file here cannot get this far: LAYERSERIES_COMPAT_gpu-k8s rejects it first.
# nooelint: oelint.file.requirenotfound - both variables are known to bitbake only, not to the linter
require ${GPU_K8S_LAYERDIR}/conf/series/${LAYERSERIES_CORENAMES}.inc

# Parse-time Python of the layer imports its modules from ${GPU_K8S_LAYERDIR}/lib through this.
# Kirkstone's base.bbclass puts every layer's lib/ on sys.path; wrynose's only adds those named
# by addpylib, which bitbake accepts in configuration files only (not in this class nor in
# the series .inc it requires), so the path is added here, once, on first use.
def gpu_k8s_lib(d, module):
    import importlib, os, sys
    lib = os.path.join(d.getVar('GPU_K8S_LAYERDIR'), 'lib')
    if lib not in sys.path:
        sys.path.insert(0, lib)
    return importlib.import_module(module)
