"""Provisioning a node at flash time: its k3s server, join token, role and labels written
onto the data partition, where gpu-k8s-data links them into /etc at first boot and where
they outlive every A/B update (meta-gpu-k8s/recipes-core/gpu-k8s-data/files/node-config.list).

Never into the image and never into the repository: into a temporary copy of the data
partition image (USB flashing) or onto the written card or disk (bmaptool targets), with
debugfs from e2fsprogs, which edits an ext4 file system without mounting it."""

from __future__ import annotations

import re
import struct
import subprocess
import tempfile
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tools.flash import tegraflash_layout
from tools.usage import UsageError

# Where gpu-k8s-data keeps provisioning files, relative to the data partition's root.
NODE_CONFIG_DIR = "gpu-k8s/node-config"
TOKEN_PATH_ON_NODE = "/etc/rancher/k3s/token"
ROLES = ("server", "agent")
# Mender's data partition label (MENDER_DATA_PART_LABEL).
DATA_LABEL = "data"
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


class ProvisionError(Exception):
    """Bad provisioning input, or it could not be written; the message names the fix."""


class ProvisionUsageError(ProvisionError, UsageError):
    """A provisioning option value that can never be written (exit status 2)."""


@dataclass(frozen=True)
class Provisioning:
    server_url: str | None = None
    token_file: Path | None = None
    role: str | None = None
    labels: tuple[str, ...] = field(default_factory=tuple)

    @property
    def wanted(self) -> bool:
        return bool(self.server_url or self.token_file or self.role or self.labels)


def check_server_url(server_url: str) -> None:
    """https://HOST:PORT, as k3s's `server:` takes it: an agent given no port would try 443,
    where no k3s server listens (its API is on 6443 unless the server moved it)."""
    url = urllib.parse.urlparse(server_url)
    if url.scheme != "https" or not url.hostname:
        raise ProvisionUsageError(f"--server-url {server_url!r} must be https://HOST:6443 (the k3s server's API "
                                  "address)")
    try:
        port = url.port
    except ValueError:
        port = -1
    if port is None:
        raise ProvisionUsageError(f"--server-url {server_url!r} has no port: k3s's API listens on 6443, so give "
                                  f"https://{url.hostname}:6443 (or the port the server's https-listen-port sets)")
    if port < 1 or url.path not in ("", "/") or url.query or url.fragment or url.username:
        raise ProvisionUsageError(f"--server-url {server_url!r} must be https://HOST:PORT and nothing else, e.g. "
                                  f"https://{url.hostname}:6443")


def validate(provisioning: Provisioning) -> str:
    """Check every option before anything is flashed; returns the token."""
    if provisioning.role is not None and provisioning.role not in ROLES:
        raise ProvisionUsageError(f"--role must be server or agent, got {provisioning.role!r}")
    if provisioning.server_url is not None:
        check_server_url(provisioning.server_url)
    if provisioning.role == "agent" and not provisioning.server_url:
        raise ProvisionUsageError("--role agent needs --server-url https://SERVER:6443 and --token-file FILE")
    if bool(provisioning.server_url) != bool(provisioning.token_file):
        raise ProvisionUsageError("--server-url and --token-file go together: an agent needs both to join "
                             "(the token is /var/lib/rancher/k3s/server/node-token on the server)")
    for label in provisioning.labels:
        key, sep, value = label.partition("=")
        if not sep or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            raise ProvisionUsageError(f"--label {label!r} is not KEY=VALUE with a Kubernetes label key and value "
                                 "(e.g. --label site=lab-2)")
    token = ""
    if provisioning.token_file is not None:
        try:
            token = provisioning.token_file.read_text(encoding="utf-8").strip()
        except OSError as error:
            raise ProvisionUsageError(f"--token-file {provisioning.token_file}: {error.strerror}") from None
        if not token or "\n" in token:
            raise ProvisionUsageError(f"--token-file {provisioning.token_file} must hold the join token on one line "
                                 "(copy the server's /var/lib/rancher/k3s/server/node-token)")
    return token


def _yaml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def node_files(provisioning: Provisioning, token: str) -> dict[str, tuple[str, int]]:
    """Path on the data partition -> (content, mode): the kept copies gpu-k8s-data links."""
    lines = ["# Written by ./task flash (provisioning). Kept on /data across A/B updates;",
             "# edit /etc/rancher/k3s/config.yaml on the node (a link to this file)."]
    if provisioning.server_url:
        lines.append(f"server: {_yaml_string(provisioning.server_url)}")
        lines.append(f"token-file: {_yaml_string(TOKEN_PATH_ON_NODE)}")
    if provisioning.labels:
        lines.append("node-label:")
        lines += [f"  - {_yaml_string(label)}" for label in provisioning.labels]
    files = {f"{NODE_CONFIG_DIR}/k3s-config": ("\n".join(lines) + "\n", 0o644)}
    if token:
        files[f"{NODE_CONFIG_DIR}/k3s-token"] = (token + "\n", 0o600)
    return files


def image_role(manifest: Path) -> str | None:
    """The k3s role an image was built with, from its manifest (k3s-server or k3s-agent)."""
    try:
        names = {line.split()[0] for line in manifest.read_text().splitlines() if line.strip()}
    except OSError:
        return None
    if "k3s-agent" in names and "k3s-server" not in names:
        return "agent"
    if "k3s-server" in names:
        return "server"
    return None


def check_role(provisioning: Provisioning, manifest: Path | None, machine: str = "MACHINE") -> None:
    if provisioning.role is None or manifest is None:
        return
    built = image_role(manifest)
    if built is not None and built != provisioning.role:
        raise ProvisionError(
            f"--role {provisioning.role}, but this image was built as a k3s {built} ({manifest}): build the "
            f"{provisioning.role} image with ./task build --machine {machine} --role {provisioning.role} and flash "
            "that one, or drop --role"
        )


# ---------------------------------------------------------------- finding the data partition


def _ext_label(handle, offset: int) -> str | None:
    handle.seek(offset + 1024)
    superblock = handle.read(136)
    if len(superblock) < 136 or struct.unpack_from("<H", superblock, 0x38)[0] != 0xEF53:
        return None
    return superblock[0x78:0x88].split(b"\0", 1)[0].decode("utf-8", "replace")


def _partitions(handle) -> list[int]:
    """Byte offsets of the partitions of a GPT or MBR disk image."""
    handle.seek(512)
    header = handle.read(92)
    offsets = []
    if header[:8] == b"EFI PART":
        entries_lba, count, size = struct.unpack_from("<QII", header, 72)
        handle.seek(entries_lba * 512)
        table = handle.read(count * size)
        for index in range(count):
            first = struct.unpack_from("<Q", table, index * size + 32)[0]
            if first:
                offsets.append(first * 512)
        return offsets
    handle.seek(446)
    mbr = handle.read(66)
    if mbr[64:66] == b"\x55\xaa":
        for index in range(4):
            start = struct.unpack_from("<I", mbr, index * 16 + 8)[0]
            if start:
                offsets.append(start * 512)
    return offsets


def data_partition_offset(image: Path) -> int:
    """Where the file system labelled 'data' starts in an ext4 image (0) or a disk image."""
    try:
        with image.open("rb") as handle:
            if _ext_label(handle, 0) == DATA_LABEL:
                return 0
            for offset in _partitions(handle):
                if _ext_label(handle, offset) == DATA_LABEL:
                    return offset
    except OSError as error:
        raise ProvisionError(f"cannot read {image}: {error.strerror}") from None
    raise ProvisionError(
        f"{image.name} has no data partition (an ext4 file system labelled '{DATA_LABEL}'): provisioning needs "
        "an A/B image (docs/fleet.md); on other images write /etc/rancher/k3s/config.yaml on the node"
    )


# ---------------------------------------------------------------- writing with debugfs


def debugfs_script(files: dict[str, tuple[str, int]], sources: dict[str, Path]) -> str:
    """mkdir fails harmlessly where a directory exists; rm makes a second flash replace the files."""
    commands = []
    directories = sorted({str(Path(path).parent) for path in files})
    for directory in directories:
        parts = Path(directory).parts
        for depth in range(1, len(parts) + 1):
            commands.append(f"mkdir {'/'.join(parts[:depth])}")
    for path, (_, mode) in sorted(files.items()):
        commands += [f"rm {path}", f"write {sources[path]} {path}",
                     f"set_inode_field {path} mode 0{0o100000 | mode:o}",
                     f"set_inode_field {path} uid 0", f"set_inode_field {path} gid 0"]
    return "\n".join(commands) + "\n"


def write_files(target: str, files: dict[str, tuple[str, int]], prefix: Sequence[str] = ()) -> None:
    """Write files into the ext4 file system at `target` (a path, with ?offset=N inside a disk),
    then read each back: debugfs reports errors in its output, not in its exit status."""
    with tempfile.TemporaryDirectory(prefix="gpu-k8s-provision-") as temp:
        sources = {}
        for index, (path, (content, _)) in enumerate(sorted(files.items())):
            source = Path(temp) / f"{index}"
            source.write_text(content)
            source.chmod(0o600)
            sources[path] = source
        script = Path(temp) / "commands"
        script.write_text(debugfs_script(files, sources))
        _debugfs([*prefix, "debugfs", "-w", "-f", str(script), target])
        for path, (content, _) in files.items():
            written = _debugfs([*prefix, "debugfs", "-R", f"cat {path}", target])
            if written != content:
                raise ProvisionError(f"debugfs did not write {path} into {target}")


def _debugfs(argv: Sequence[str]) -> str:
    try:
        completed = subprocess.run(list(argv), capture_output=True, text=True, timeout=120, check=False)
    except FileNotFoundError:
        raise ProvisionError("debugfs not found: install e2fsprogs (sudo apt-get install e2fsprogs)") from None
    if completed.returncode != 0:
        lines = [line for line in completed.stderr.splitlines() if line.strip()]
        raise ProvisionError(f"debugfs failed: {lines[-1] if lines else completed.returncode}")
    return completed.stdout


def summary(provisioning: Provisioning) -> str:
    parts = []
    if provisioning.server_url:
        parts.append(f"joins {provisioning.server_url}")
    if provisioning.labels:
        parts.append(f"labels {', '.join(provisioning.labels)}")
    return "provisioned on the data partition: " + ("; ".join(parts) or "role checked")


# ---------------------------------------------------------------- the flash paths


def manifest_beside(image: Path) -> Path | None:
    """The build's package manifest for an image file in its deploy directory, if there."""
    base = image.name.split(".", 1)[0]
    for name in (f"{base}.manifest", f"{base}.rootfs.manifest"):
        if (image.parent / name).is_file():
            return image.parent / name
    return None


REBUILD = ("rebuild the image (./task build) and flash the board with the new package: provisioning lives on the "
           "data partition, which a board gets from a full flash of such a package")


def data_image_in(package_dir: Path, rebuild: str = REBUILD) -> tuple[Path, tegraflash_layout.DataPartition]:
    """The unpacked package's data partition image, found through its flash layouts
    (tools/flash/tegraflash_layout.py). Raises ProvisionError naming what the package lacks."""
    try:
        partitions = tegraflash_layout.data_partitions(package_dir)
    except tegraflash_layout.LayoutError as error:
        raise ProvisionError(f"this tegraflash package has {error}") from None
    layouts = " and ".join(name for name in tegraflash_layout.LAYOUTS if (package_dir / name).is_file())
    if not partitions:
        raise ProvisionError(
            f"this tegraflash package has no data partition ({layouts} give no partition the "
            f"{tegraflash_layout.DATA_TOKEN} image): it was built without one, by an image from before the data "
            f"partition or without A/B updates; {rebuild}"
        )
    first = partitions[0]
    if not first.image:
        raise ProvisionError(
            f"this tegraflash package's {first.layout} has a data partition ({first.partition}) but the package "
            f"carries no image for it ({tegraflash_layout.DATA_TOKEN} is empty); {rebuild}"
        )
    image = package_dir / first.image
    if not image.is_file():
        raise ProvisionError(f"this tegraflash package names {first.image} for its data partition ({first.partition} "
                             f"in {first.layout}) but holds no such file; {rebuild}")
    try:
        with image.open("rb") as handle:
            label = _ext_label(handle, 0)
    except OSError as error:
        raise ProvisionError(f"cannot read {image.name}: {error.strerror}") from None
    if label != DATA_LABEL:
        raise ProvisionError(f"{first.image}, this package's data partition image, is not an ext4 file system labelled "
                             f"'{DATA_LABEL}' (MENDER_DATA_PART_LABEL); {rebuild}")
    return image, first


def _tar_flags(package: Path) -> list[str]:
    if package.name.endswith(".zst"):
        return ["--zstd"]
    return ["-z"] if package.name.endswith((".gz", ".tgz")) else []


def _tar(package: Path, args: Sequence[str]) -> str:
    completed = subprocess.run(["tar", *_tar_flags(package), *args], capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        lines = [line for line in completed.stderr.splitlines() if line.strip()]
        raise ProvisionError(f"cannot read {package.name}: {lines[-1] if lines else 'tar failed'}")
    return completed.stdout


def peek_package(package: Path, into: Path) -> None:
    """For a dry run: only the members the data-partition check reads, not the gigabytes."""
    names = _tar(package, ["-tf", str(package)]).splitlines()
    small = [name for name in names if tegraflash_layout.small_members(Path(name).name)]
    if small:
        _tar(package, ["-xf", str(package), "-C", str(into), "--", *small])
    try:
        wanted = {part.image for part in tegraflash_layout.data_partitions(into) if part.image}
    except tegraflash_layout.LayoutError:
        return  # data_image_in says what is wrong
    images = [name for name in names if Path(name).name in wanted]
    if images:
        _tar(package, ["-xf", str(package), "-C", str(into), "--", *images])


def into_unpacked_package(workdir: Path, provisioning: Provisioning, token: str, dry_run: bool,
                          rebuild: str = REBUILD) -> str:
    """USB flashing and the flash scripts: the tegraflash package's data partition image (a
    copy in the temporary work directory) gets the files before anything is flashed."""
    image, partition = data_image_in(workdir, rebuild)
    where = f"{image.name} (partition {partition.partition} of {partition.layout})"
    if dry_run:
        return f"would write the provisioning into {where}"
    write_files(str(image), node_files(provisioning, token))
    return summary(provisioning) + f" ({where})"


def onto_device(image: Path, device_file: Path, provisioning: Provisioning, token: str, prefix: Sequence[str],
                dry_run: bool) -> str:
    """bmaptool targets: the image stays as built; its data partition on the written card or
    disk (same offset as in the image) gets the files."""
    if dry_run and not image.is_file():
        return f"would write the provisioning into the data partition of {device_file}"
    offset = data_partition_offset(image)
    target = f"{device_file}?offset={offset}" if offset else str(device_file)
    if dry_run:
        return f"would write the provisioning into the data partition of {device_file} (offset {offset})"
    write_files(target, node_files(provisioning, token), prefix)
    return summary(provisioning)
