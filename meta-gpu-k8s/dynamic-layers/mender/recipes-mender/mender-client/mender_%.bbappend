# With the A/B class only (classes/gpu_k8s_mender.bbclass): meta-mender's do_install copies
# MENDER_ARTIFACT_VERIFY_KEY into the image but hashes only its path, so a new key written over
# the old file came back from sstate as the old key, and every board built then refused the
# artifacts signed with the new one. The file's content counts here (PATH:MUST-EXIST).
GPU_K8S_VERIFY_KEY_CHECKSUM = "${@'%s:True' % d.getVar('MENDER_ARTIFACT_VERIFY_KEY') if d.getVar('MENDER_ARTIFACT_VERIFY_KEY') and 'gpu-k8s-mender' in (d.getVar('DISTRO_FEATURES') or '').split() else ''}"
do_install[file-checksums] += "${GPU_K8S_VERIFY_KEY_CHECKSUM}"
