"""Mender artifacts as mender-artifact lays them out (outer tar: version, manifest,
manifest.sig, header.tar.gz with header-info, data), made in the test: rootfs-image payloads
as meta-mender writes them, tegra-rootfs-image module images as meta-mender-tegra's native
scheme does (image_types_mender_tegra_native.bbclass), signed as mender-artifact signs them
(signing_keys.py; tests/tools/test_release.py checks real mender-artifact accepts them)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

from signing_keys import PrivateKey, fleet_key, public_pem, sign_manifest

NANO = "jetson-nano-devkit"


def _tar_bytes(files: dict[str, bytes], compress: str = "") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=f"w:{compress}") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def make_artifact(path: Path, name: str = "1.4.0", signed: bool = True, corrupt: bool = False,
                  device_type: str = NANO, payload_type: str = "rootfs-image", key: PrivateKey | None = None) -> Path:
    """A .mender file, signed with `key` (default: the fake fleet's key) unless signed=False.
    Its manifest lists `version`, the header and each file inside the payload (data/0000/FILE),
    as mender-artifact writes it; corrupt=True changes a payload file after the manifest."""
    header_info = {"payloads": [{"type": payload_type}],
                   "artifact_provides": {"artifact_name": name},
                   "artifact_depends": {"device_type": [device_type]}}
    rootfs = b"\0" * 4096
    type_info = {"type": payload_type, "artifact_provides": {f"{payload_type}.version": name}}
    members = {
        "version": json.dumps({"format": "mender", "version": 3}).encode(),
        "header.tar.gz": _tar_bytes({"header-info": json.dumps(header_info).encode(),
                                     "headers/0000/type-info": json.dumps(type_info).encode(),
                                     "headers/0000/meta-data": b""}, "gz"),
    }
    listed = {**members, "data/0000/rootfs.ext4": rootfs}
    manifest = "".join(f"{hashlib.sha256(data).hexdigest()}  {member}\n" for member, data in sorted(listed.items()))
    outer = {"version": members["version"], "manifest": manifest.encode()}
    if signed:
        outer["manifest.sig"] = sign_manifest(key or fleet_key(), outer["manifest"])
    outer["header.tar.gz"] = members["header.tar.gz"]
    outer["data/0000.tar.gz"] = _tar_bytes({"rootfs.ext4": b"\1" * 4096 if corrupt else rootfs}, "gz")
    path.write_bytes(_tar_bytes(outer))
    return path


def record_verify_key(manifest: Path, key: PrivateKey | None = None) -> Path:
    """What the layer leaves beside an image's manifest: the verify key its root filesystem
    holds (meta-gpu-k8s/lib/gpu_k8s/signing.py, deploy_verify_key)."""
    record = manifest.with_name(manifest.name.removesuffix(".manifest") + ".artifact-verify-key.pem")
    record.write_bytes(public_pem(key or fleet_key()))
    return record
