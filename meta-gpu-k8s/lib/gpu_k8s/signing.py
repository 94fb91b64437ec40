"""Build-time check of the keys that sign update artifacts (pure: paths in, problems out), and
the record of the verify key an image carries.

Used by classes/gpu_k8s_mender.bbclass before an image's root filesystem and artifact are
made, and after its root filesystem is; kept free of bitbake so the tests can call it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# Beside the image's manifest in the deploy directory: the verify key its root filesystem holds
# (/etc/mender/artifact-verify-key.pem), which `./task release` checks each artifact against.
VERIFY_KEY_SUFFIX = ".artifact-verify-key.pem"

MODES = ("required", "optional", "off")
MAKE_KEYS = (
    "make a pair with `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out signing.key "
    "&& openssl pkey -in signing.key -pubout -out verify.pem`, keep signing.key off the repository"
)


def _read_head(path: Path) -> str:
    try:
        with path.open("r", errors="replace") as handle:
            return handle.read(4096)
    except OSError:
        return ""


def signing_problems(mode: str | None, signing_key: str | None, verify_key: str | None) -> list[str]:
    """Why this build may not go on, one sentence each naming the fix; [] when it may."""
    mode = (mode or "").strip()
    if mode not in MODES:
        return [f'GPU_K8S_ARTIFACT_SIGNING must be one of {", ".join(MODES)}, got "{mode}"']
    signing_key = (signing_key or "").strip()
    verify_key = (verify_key or "").strip()
    problems: list[str] = []
    for name, value in (("MENDER_ARTIFACT_SIGNING_KEY", signing_key), ("MENDER_ARTIFACT_VERIFY_KEY", verify_key)):
        if value and not Path(value).is_absolute():
            # meta-mender runs mender-artifact and `install` in each task's own directory
            problems.append(f"{name} ({value}) is a relative path, which bitbake's tasks, each run in a "
                            "directory of its own, cannot find: give it as an absolute path")
    if problems:
        return problems
    if verify_key:
        head = _read_head(Path(verify_key))
        if not Path(verify_key).is_file():
            problems.append(f"MENDER_ARTIFACT_VERIFY_KEY names {verify_key}, which is not a file")
        elif "PRIVATE KEY" in head:
            problems.append(
                f"MENDER_ARTIFACT_VERIFY_KEY ({verify_key}) is a private key and would be copied into "
                "the image; give its public key (`openssl pkey -in KEY -pubout`)"
            )
        elif "PUBLIC KEY" not in head:
            problems.append(f"MENDER_ARTIFACT_VERIFY_KEY ({verify_key}) is not a PEM public key")
    if signing_key and not Path(signing_key).is_file():
        problems.append(f"MENDER_ARTIFACT_SIGNING_KEY names {signing_key}, which is not a file")
    if mode == "off":
        return problems
    if mode == "required":
        missing = [name for name, value in (("MENDER_ARTIFACT_SIGNING_KEY", signing_key),
                                            ("MENDER_ARTIFACT_VERIFY_KEY", verify_key)) if not value]
        if missing:
            problems.append(
                f"signed update artifacts are required but {' and '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not set: set both in the environment or "
                f"conf/site.conf to key files outside the repository ({MAKE_KEYS}), or set "
                'GPU_K8S_ARTIFACT_SIGNING = "off" for a lab image that accepts unsigned artifacts'
            )
    elif bool(signing_key) != bool(verify_key):
        given, absent = (("MENDER_ARTIFACT_SIGNING_KEY", "MENDER_ARTIFACT_VERIFY_KEY") if signing_key
                         else ("MENDER_ARTIFACT_VERIFY_KEY", "MENDER_ARTIFACT_SIGNING_KEY"))
        problems.append(f"{given} is set but {absent} is not: set both, or neither")
    return problems


def deployed_verify_key_name(manifest_name: str) -> str:
    """The record's file name for an image whose manifest is `manifest_name`."""
    stem = manifest_name[:-len(".manifest")] if manifest_name.endswith(".manifest") else manifest_name
    return stem + VERIFY_KEY_SUFFIX


def deploy_verify_key(image_key: str, manifest: str, deploy_dir: str, link_name: str) -> str:
    """Copy the verify key the image's root filesystem holds beside its manifest, with a link
    under the image's stable name as bitbake makes for the manifest. Taken from the root
    filesystem, not from MENDER_ARTIFACT_VERIFY_KEY: what the boards will hold is what counts
    (a mender package restored from sstate keeps the key it was built with). Returns the file
    written, '' for an image that holds no verify key (unsigned)."""
    if not manifest or not os.path.isfile(image_key):
        return ""
    target = os.path.join(deploy_dir, deployed_verify_key_name(os.path.basename(manifest)))
    shutil.copyfile(image_key, target)
    if link_name:
        link = os.path.join(deploy_dir, link_name + VERIFY_KEY_SUFFIX)
        if link != target:
            if os.path.lexists(link):
                os.remove(link)
            os.symlink(os.path.basename(target), link)
    return target
