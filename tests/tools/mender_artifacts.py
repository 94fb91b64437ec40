"""Mender artifacts as mender-artifact lays them out (outer tar: version, manifest,
manifest.sig, header.tar.gz with header-info, data), made in the test: rootfs-image payloads
as meta-mender writes them, tegra-rootfs-image module images as meta-mender-tegra's native
scheme does (image_types_mender_tegra_native.bbclass)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

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
                  device_type: str = NANO, payload_type: str = "rootfs-image") -> Path:
    header_info = {"payloads": [{"type": payload_type}],
                   "artifact_provides": {"artifact_name": name},
                   "artifact_depends": {"device_type": [device_type]}}
    members = {
        "version": json.dumps({"format": "mender", "version": 3}).encode(),
        "header.tar.gz": _tar_bytes({"header-info": json.dumps(header_info).encode()}, "gz"),
        "data/0000.tar.gz": _tar_bytes({"rootfs.ext4": b"\0" * 4096}, "gz"),
    }
    manifest = "".join(f"{hashlib.sha256(data).hexdigest()}  {member}\n" for member, data in members.items())
    if corrupt:
        members["data/0000.tar.gz"] = _tar_bytes({"rootfs.ext4": b"\1" * 4096}, "gz")
    outer = {"version": members["version"], "manifest": manifest.encode()}
    if signed:
        outer["manifest.sig"] = b"MEUCIQ-fake-signature"
    outer.update({k: v for k, v in members.items() if k != "version"})
    path.write_bytes(_tar_bytes(outer))
    return path


