"""Check 9 (Jetson): the CSV lists that tell the nvidia runtime what to mount into containers."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence

from ..config.settings import Settings
from .host import host_path, read_text, short_list
from .report import FAIL, PASS, SKIP, WARN, Check

CSV_DIR = "/etc/nvidia-container-runtime/host-files-for-container.d"
_CSV_DEV = re.compile(r"^\s*dev\s*,", re.MULTILINE)
_CSV_DEV_PATH = re.compile(r"^\s*dev\s*,\s*(\S+)\s*$", re.MULTILINE)
_CSV_ENTRY = re.compile(r"^\s*(?:lib|sym|dir)\s*,", re.MULTILINE)
# On Thor the runtime's CSV mode hands containers only the /dev/nvidia* nodes these name. meta-tegra
# R39's devices.csv names them all; R36's (scarthgap, Orin only) names /dev/nvidia0 and /dev/nvidiactl
# for Orin's display but not /dev/nvidia-uvm, without which CUDA on OpenRM cannot start.
OPENRM_CSV_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm")


def evaluate_csv(gpu_kind: str | None, files: Sequence[tuple[str, str]], needed_nodes: Sequence[str] = ()) -> Check:
    """`files`: (file name, text) of each *.csv in CSV_DIR; `needed_nodes`: device nodes the GPU cannot
    work without in a container (Thor's), which the `dev` lines must name."""
    name = "runtime CSV files"
    if gpu_kind != "tegra":
        return Check(name, SKIP, "only Jetson's nvidia runtime mounts files from CSV lists")
    fix = ("install nvidia-container-runtime (it ships l4t.csv) and the *-container-csv packages of the "
           f"libraries pods use (CUDA, cuDNN, TensorRT) into {CSV_DIR}")
    if not files:
        return Check(name, FAIL, f"no *.csv in {CSV_DIR}: the nvidia runtime on Jetson injects only what these "
                     "list, so containers would get no GPU device nodes or CUDA libraries", fix)
    devices = sum(len(_CSV_DEV.findall(text)) for _, text in files)
    others = sum(len(_CSV_ENTRY.findall(text)) for _, text in files)
    names = short_list(sorted(n for n, _ in files))
    if devices == 0:
        return Check(name, WARN, f"{len(files)} CSV file(s) in {CSV_DIR} ({names}) but none lists a device node "
                     "(dev, /dev/...): containers would get libraries but not the GPU",
                     "install nvidia-container-runtime, whose l4t.csv lists the GPU device nodes")
    listed = {path for _, text in files for path in _CSV_DEV_PATH.findall(text)}
    unlisted = [node for node in needed_nodes if node not in listed]
    if unlisted:
        return Check(name, FAIL, f"{len(files)} CSV file(s) in {CSV_DIR} ({names}) list no {', '.join(unlisted)}: "
                     "the nvidia runtime's CSV mode would give containers Thor's GPU without them, and CUDA "
                     "in them would find no GPU",
                     "install meta-tegra's R39 devices.csv (tegra-configs-container-csv), which lists "
                     "/dev/nvidia0, /dev/nvidiactl and /dev/nvidia-uvm")
    return Check(name, PASS, f"{len(files)} CSV file(s) in {CSV_DIR} ({names}): {devices} device node(s), "
                 f"{others} libraries, links and directories")


def read_csv_files(settings: Settings) -> list[tuple[str, str]]:
    out = []
    for path in sorted(glob.glob(host_path(settings, CSV_DIR) + "/*.csv")):
        text = read_text(path)
        if text is not None:
            out.append((os.path.basename(path), text))
    return out
