# Changes meta-mender's client only with the A/B class: its do_install hashes the verify key's
# content (classes/gpu_k8s_mender_verify_key.bbclass).
inherit ${@bb.utils.contains('DISTRO_FEATURES', 'gpu-k8s-mender', 'gpu_k8s_mender_verify_key', '', d)}
