"""The layer's own data-partition scripts (meta-gpu-k8s/recipes-core/gpu-k8s-data) in a
simulated board's boot, before the agent runs: gpu-k8s-data-check on an image file standing in
for the partition (the real e2fsck, mke2fs and blkid; mount and umount stand-ins that only
succeed), then gpu-k8s-data filing the verdict in /data's log. The board's root is the scripts'
GPU_K8S_ROOT, so their files land where the agent is told to read them (fake_board.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from fake_board import REPO_ROOT, SimulatedNode

FILES = REPO_ROOT / "meta-gpu-k8s" / "recipes-core" / "gpu-k8s-data" / "files"
SBIN_PATH = "/usr/sbin:/sbin:/usr/bin:/bin"
E2FSPROGS = all(shutil.which(tool, path=SBIN_PATH) for tool in ("e2fsck", "mkfs.ext4", "blkid"))
DEVICE = "/dev/vda4"
PARTITIONS = ("clean", "damaged", "lost", "missing")


def _write_partition(image: Path, partition: str) -> None:
    image.unlink(missing_ok=True)
    if partition == "missing":
        return
    if partition == "lost":  # nothing e2fsck can find: zeros
        with image.open("wb") as stream:
            stream.truncate(16 << 20)
        return
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "data", str(image), "16M"], check=True,
                   env={"PATH": SBIN_PATH})
    if partition == "damaged":  # the primary superblock's magic: e2fsck -fy repairs it from a backup
        with image.open("r+b") as stream:
            stream.seek(1080)
            stream.write(b"\0\0")


def data_boot(board: SimulatedNode, partition: str) -> dict[str, Any]:
    """The check and gpu-k8s-data, as this boot runs them, on a partition that is `partition`
    (one of PARTITIONS). A lost one takes everything on the board's /data with it, the agent's
    marker and log included. Returns the check's verdict as it wrote it."""
    assert partition in PARTITIONS, partition
    root = board.root
    stubs = root / "layer-bin"
    stubs.mkdir(exist_ok=True)
    for tool in ("mount", "umount"):
        (stubs / tool).write_text("#!/bin/sh\nexit 0\n")
        (stubs / tool).chmod(0o755)
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc" / "fstab").write_text(f"{DEVICE} /data auto defaults,nofail 0 0\n")
    (root / "dev").mkdir(exist_ok=True)
    _write_partition(root / DEVICE.lstrip("/"), partition)
    if partition == "lost":
        shutil.rmtree(root / "data", ignore_errors=True)
        (root / "data").mkdir()
    unmounted = root / "mountinfo-before"
    unmounted.write_text("20 1 8:1 / / rw - ext4 /dev/root rw\n")
    state_file = root / "run" / "gpu-k8s" / "data-state.json"
    environment = {**os.environ, "PATH": f"{stubs}:{SBIN_PATH}", "GPU_K8S_ROOT": str(root),
                   "GPU_K8S_MOUNTINFO": str(unmounted), "GPU_K8S_DATA_DEVICE_TIMEOUT": "0"}
    check = subprocess.run(["sh", str(FILES / "gpu-k8s-data-check.sh")], env=environment, capture_output=True,
                           text=True, timeout=120, check=False)
    verdict = json.loads(state_file.read_text())
    assert check.returncode == (1 if verdict["state"] == "unavailable" else 0), check.stdout + check.stderr
    if verdict["state"] == "unavailable":
        return verdict  # /data stays unmounted: gpu-k8s-data refuses, nothing is filed
    mounted = root / "mountinfo-after"
    mounted.write_text(unmounted.read_text() + f"21 1 8:4 / /data rw - ext4 {DEVICE} rw\n")
    empty = root / "empty.list"
    empty.write_text("")
    filed = subprocess.run(["sh", str(FILES / "gpu-k8s-data.sh")], capture_output=True, text=True, timeout=60,
                           check=False, env={**environment, "GPU_K8S_MOUNTINFO": str(mounted),
                                             "GPU_K8S_PERSIST_LIST": str(empty),
                                             "GPU_K8S_NODE_CONFIG_LIST": str(empty),
                                             "GPU_K8S_DATA_STATE": str(state_file),
                                             "GPU_K8S_BOOT_ID": str(board.boot_id_file)})
    assert filed.returncode == 0, filed.stdout + filed.stderr
    return verdict
