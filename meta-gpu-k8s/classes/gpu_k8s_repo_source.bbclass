# For recipes built from (or installing what is built from) directories of this repository
# (GPU_K8S_REPO_SOURCE: plugin, updater) three levels above the recipe, outside the layer. The layer is used from a checkout
# of the whole repository; a copy of the layer alone (yocto-check-layer copies only the layer)
# lacks that directory, and bitbake 2.18 stops the whole parse at a missing file:// entry.
# Such a recipe is skipped instead, with the reason; so is the packagegroup that installs it,
# or "bitbake world" would fail on the missing provider.
# nooelint: oelint.task.noanonpython - a missing source directory must skip the recipe with the reason
python () {
    names = (d.getVar("GPU_K8S_REPO_SOURCE") or "").split()
    if not names:
        bb.fatal("%s inherits gpu_k8s_repo_source without setting GPU_K8S_REPO_SOURCE" % d.getVar("PN"))
    top = os.path.normpath(os.path.join(os.path.dirname(d.getVar("FILE")), "..", "..", ".."))
    for name in names:
        if not os.path.isdir(os.path.join(top, name)):
            raise bb.parse.SkipRecipe("%s/ is not next to the layer (%s): use meta-gpu-k8s from a checkout of "
                                      "the whole repository" % (name, top))
}
