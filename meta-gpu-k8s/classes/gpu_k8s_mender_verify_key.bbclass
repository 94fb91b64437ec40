# meta-mender's mender recipe with the A/B class (dynamic-layers/mender/recipes-mender/
# mender-client/mender_%.bbappend inherits it). Its do_install copies MENDER_ARTIFACT_VERIFY_KEY
# into the image but hashes only the path: a new key written over the old file came back from
# sstate as the old key, and every board built then refused the artifacts signed with the new
# one. The file's content counts here (file-checksums entries are PATH:MUST-EXIST).
do_install[file-checksums] += "${@'%s:True' % d.getVar('MENDER_ARTIFACT_VERIFY_KEY') if d.getVar('MENDER_ARTIFACT_VERIFY_KEY') else ''}"
