"""`release`: gather a build's signed .mender artifacts into one directory a web server (or a
USB stick) can serve: the artifacts, their sha256 and release.json (version, machine, L4T and
k3s versions, artifact name). `./task rollout --artifact-url` then points at it.

A Mender artifact is a tar: `version`, `manifest` (sha256 of every other member),
`manifest.sig` when signed, `header.tar[.gz|.xz]` (header-info: artifact name, device types,
payload types) and the payload data. We read it with the standard library and check the
signature as the Mender client will (tools/mender_signing.py), against the verify key the image
holds (recorded beside it by the layer) or --verify-key: a release needs no Mender tools."""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import os
import re
import shutil
import tarfile
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO

from tools import console, mender_signing
from tools.flash import provision
from tools.image import build, preflight
from tools.paths import BUILD_ROOT
from tools.usage import UsageError

CHUNK = 4 * 1024 * 1024
HEADER_NAMES = ("header.tar.gz", "header.tar.xz", "header.tar", "header.tar.zst")
# A payload member and how its tar is compressed (tarfile's stream modes)
PAYLOAD_SUFFIXES = {".tar.gz": "gz", ".tar.xz": "xz", ".tar": "", ".tar.zst": "zst"}
_PAYLOAD = re.compile(r"^data/(\d{4})\.tar(\.gz|\.xz|\.zst)?$")
_PAYLOAD_FILE = re.compile(r"^data/\d{4}/.+$")
K3S_PACKAGES = ("k3s", "k3s-server", "k3s-agent", "k3s-bin")
L4T_PACKAGES = ("nv-tegra-release", "tegra-libraries-core")


class ReleaseError(Exception):
    """Nothing to release, or an artifact we must not serve; the message says what to do."""


class ReleaseUsageError(ReleaseError, UsageError):
    """An option value that names nothing to release."""


@dataclass(frozen=True)
class ReleaseOptions:
    kas: str | None = None  # one kas file; None: every machine that has artifacts
    build_dir: Path | None = None
    deploy_dir: Path | None = None  # overrides what --kas/--build-dir would find
    output: Path | None = None  # default build/release/<version>
    verify_key: Path | None = None  # the key the boards hold, when not the one the image carries


@dataclass
class ArtifactInfo:
    file: str
    sha256: str
    size_bytes: int
    artifact_name: str
    device_types: list[str]
    payload_types: list[str]
    machine: str
    signed: bool
    role: str | None = None  # the k3s role, from the image's manifest
    l4t_version: str | None = None
    k3s_version: str | None = None
    verify_key_sha256: str | None = None  # the key its signature verified with (mender_signing.FINGERPRINT_NAME)
    source: str = field(default="", repr=False)


# ---------------------------------------------------------------- reading a .mender file


def read_mender(path: Path) -> dict[str, object]:
    """Name, device types, payload types, the manifest and its signature (None: unsigned),
    after checking every member against the artifact's own manifest."""
    if not tarfile.is_tarfile(path):
        raise ReleaseError(f"{path.name} is not a Mender artifact (not a tar archive)")
    with tarfile.open(path, "r:") as archive:  # the outer tar is never compressed
        members = {member.name: member for member in archive.getmembers() if member.isfile()}
        if "version" not in members or "manifest" not in members:
            raise ReleaseError(f"{path.name} is not a Mender artifact (no version/manifest members)")
        version = json.loads(_member_bytes(archive, members["version"]))
        if version.get("format") != "mender" or int(version.get("version", 0)) < 2:
            raise ReleaseError(f"{path.name}: unsupported artifact format {version}")
        _check_manifest(path, archive, members)
        header_name = next((name for name in HEADER_NAMES if name in members), None)
        if header_name is None:
            raise ReleaseError(f"{path.name} has no header member")
        info = _header_info(path, header_name, _member_bytes(archive, members[header_name]))
        manifest = _member_bytes(archive, members["manifest"])
        signature = _member_bytes(archive, members["manifest.sig"]) if "manifest.sig" in members else None
    provides = info.get("artifact_provides") or {}
    depends = info.get("artifact_depends") or {}
    name = provides.get("artifact_name") or info.get("artifact_name", "")
    if not name:
        raise ReleaseError(f"{path.name}: its header names no artifact_name")
    return {
        "artifact_name": str(name),
        "device_types": [str(d) for d in depends.get("device_type") or info.get("device_types_compatible") or []],
        "payload_types": [str(p.get("type")) for p in info.get("payloads") or []],
        "signed": signature is not None,
        "manifest": manifest,  # the signed bytes
        "signature": signature,
    }


def _member_bytes(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    stream = archive.extractfile(member)
    if stream is None:
        raise ReleaseError(f"cannot read {member.name}")
    return stream.read()


def _sha256(stream: IO[bytes]) -> str:
    digest = hashlib.sha256()
    for chunk in iter(lambda: stream.read(CHUNK), b""):
        digest.update(chunk)
    return digest.hexdigest()


def _payload_digests(path: Path, archive: tarfile.TarFile, members: Mapping[str, tarfile.TarInfo],
                     index: str) -> dict[str, str]:
    """sha256 of each file inside payload `index` (data/0000.tar.gz holds rootfs.ext4, which
    the manifest lists as data/0000/rootfs.ext4), read as a stream."""
    name = next((f"data/{index}{suffix}" for suffix in PAYLOAD_SUFFIXES if f"data/{index}{suffix}" in members), None)
    if name is None:
        return {}
    if name.endswith(".zst"):
        raise ReleaseError(f"{path.name} has a zstd payload, which this tool cannot read: build with gzip or xz")
    stream = archive.extractfile(members[name])
    assert stream is not None
    digests = {}
    with tarfile.open(fileobj=stream, mode="r|" + PAYLOAD_SUFFIXES[name[len(f"data/{index}"):]]) as payload:
        for member in payload:
            content = payload.extractfile(member) if member.isfile() else None
            if content is not None:
                digests[f"data/{index}/{member.name}"] = _sha256(content)
    return digests


def _check_manifest(path: Path, archive: tarfile.TarFile, members: Mapping[str, tarfile.TarInfo]) -> None:
    """Every file the manifest lists, as the Mender client checks it: the outer members by
    their own bytes, the payloads' files (data/NNNN/FILE) by theirs; a payload file it does
    not list is refused too."""
    listed = {}
    for line in _member_bytes(archive, members["manifest"]).decode("utf-8", "replace").splitlines():
        parts = line.split()
        if len(parts) == 2:
            listed[parts[1]] = parts[0]
    payloads = sorted({match[1] for name in members if (match := _PAYLOAD.match(name))})
    actual = {name: digest for index in payloads for name, digest in _payload_digests(path, archive, members,
                                                                                       index).items()}
    for name, digest in listed.items():
        if name not in actual and _PAYLOAD_FILE.match(name) is None and name in members:
            stream = archive.extractfile(members[name])
            assert stream is not None
            actual[name] = _sha256(stream)
        if name not in actual:
            raise ReleaseError(f"{path.name} is incomplete: its manifest lists {name}, which is missing")
        if actual[name] != digest:
            raise ReleaseError(f"{path.name} is corrupt: {name} does not match its manifest checksum")
    unlisted = sorted(name for name in actual if name not in listed)
    if unlisted:
        raise ReleaseError(f"{path.name} is corrupt: {unlisted[0]} is not in its manifest")


def _header_info(path: Path, name: str, data: bytes) -> dict:
    if name.endswith(".zst"):
        raise ReleaseError(f"{path.name} has a zstd header, which this tool cannot read: build with gzip or xz")
    if name.endswith(".xz"):
        data = lzma.decompress(data)
    mode = "r:gz" if name.endswith(".gz") else "r:"
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode=mode) as header:
            member = header.getmember("header-info")
            stream = header.extractfile(member)
            assert stream is not None
            return json.loads(stream.read())
    except (tarfile.TarError, KeyError, ValueError) as error:
        raise ReleaseError(f"{path.name}: unreadable header ({error})") from None


# ---------------------------------------------------------------- what the build produced


def image_manifest_versions(manifest: Path, packages: Iterable[str]) -> str | None:
    """The version of the first of `packages` in a Yocto image manifest ('name arch version')."""
    try:
        lines = manifest.read_text().splitlines()
    except OSError:
        return None
    versions = {}
    for line in lines:
        parts = line.split()
        if len(parts) == 3:
            versions[parts[0]] = re.sub(r"-r\d+$", "", parts[2])
    return next((versions[name] for name in packages if name in versions), None)


def release_candidates(deploy_dir: Path) -> list[Path]:
    """The artifacts to release: what the stable-name links point at (the newest build of
    each image), or every regular .mender file when there are no links."""
    links = sorted(p for p in deploy_dir.glob("*.mender") if p.is_symlink())
    if links:
        return sorted({link.resolve() for link in links if link.resolve().is_file()})
    return sorted(p for p in deploy_dir.glob("*.mender") if p.is_file())


@dataclass(frozen=True)
class Source:
    """A deploy directory to release from, and what built it."""

    machine: str  # the Yocto MACHINE
    directory: Path
    built_by: str  # how a person names the build: `--machine x86-64 --role agent`, or the directory


def machines_to_release(options: ReleaseOptions) -> list[Source]:
    """The deploy dirs to look in: --deploy-dir; else every role's build of the --kas
    file's machine; else every machine's and role's build."""
    if options.deploy_dir is not None:
        if not options.deploy_dir.is_dir():
            # A typo, not a missing build: "build first" would send the person the wrong way.
            raise ReleaseError(
                f"--deploy-dir {options.deploy_dir} is not a directory: give the deploy directory of a build "
                "(e.g. build/jetson-nano/build/tmp/deploy/images/jetson-nano-devkit), or leave it out"
            )
        machine = _machine_for_kas(options.kas).yocto_machine if options.kas else options.deploy_dir.name
        return [Source(machine, options.deploy_dir, "--deploy-dir")]
    names = [_machine_name_for_kas(options.kas)] if options.kas else list(build.MACHINES)
    found: list[Source] = []
    for name in names:
        default = build.MACHINES[name].default_role
        for role in [default, *(role for role in build.ROLES if role != default)]:
            directory = build.built_deploy_dir(name, role, options.build_dir if options.kas else None)
            if all(source.directory != directory for source in found):
                role_flag = "" if role == build.MACHINES[name].default_role else f" --role {role}"
                found.append(Source(build.MACHINES[name].yocto_machine, directory, f"--machine {name}{role_flag}"))
    return found


def _machine_name_for_kas(kas: str) -> str:
    wanted = Path(kas).as_posix().removeprefix("./")
    for name, target in build.MACHINES.items():
        if target.kas_file == wanted:
            return name
    for name, target in build.MACHINES.items():
        if target.kas_file.split(":", 1)[0] == wanted.split(":", 1)[0]:
            return name
    known = ", ".join(target.kas_file for target in build.MACHINES.values())
    raise ReleaseUsageError(f"--kas {kas}: not one of our kas files ({known})")


def _machine_for_kas(kas: str) -> build.MachineTarget:
    return build.MACHINES[_machine_name_for_kas(kas)]


def expected_payload(yocto_machine: str) -> str | None:
    """The payload type the machine's boards install (build.MACHINES), None when unknown."""
    types = {target.update_payload for target in build.MACHINES.values() if target.yocto_machine == yocto_machine}
    return types.pop() if len(types) == 1 else None


def check_payload(path: Path, machine: str, payload_types: list[str]) -> None:
    """An artifact of the other Mender scheme installs on no board of this machine: an Orin
    flashed with the native scheme takes tegra-rootfs-image only (and the reverse)."""
    expected = expected_payload(machine)
    if expected and payload_types != [expected]:
        raise ReleaseError(
            f"{path.name} carries payload {', '.join(payload_types) or '(none)'}, but {machine} boards install "
            f"{expected} artifacts (docs/fleet.md): it was built with another Mender integration; rebuild it with "
            "this repository's kas files"
        )


def describe_sources(sources: list[Source], empty: list[Source]) -> str:
    """Where release looked, for a person: the builds that exist but hold no artifact by name;
    the machines and roles never built only in a count (they are no candidates)."""
    built = [source for source in empty if source.directory.is_dir()]
    unbuilt = [source for source in empty if not source.directory.is_dir()]
    parts = [f"{source.directory} ({source.built_by}) holds no .mender artifact: an image without A/B updates, or "
             "a build that stopped before it" for source in built]
    if len(sources) == 1 and unbuilt:
        parts.append(f"{unbuilt[0].directory} does not exist")
    elif not built:
        parts.append(f"no machine has been built under {BUILD_ROOT} yet")
    elif unbuilt:
        parts.append(f"the {len(unbuilt)} other machine and role builds do not exist")
    return "; ".join(parts)


def collect(options: ReleaseOptions) -> list[ArtifactInfo]:
    artifacts: list[ArtifactInfo] = []
    sources = machines_to_release(options)
    empty = []
    for source in sources:
        candidates = release_candidates(source.directory) if source.directory.is_dir() else []
        if not candidates:
            empty.append(source)
        for path in candidates:
            artifacts.append(artifact_info(path, source.machine, options.verify_key))
    if not artifacts:
        raise ReleaseError(
            f"nothing to release: {describe_sources(sources, empty)}. Build first (./task build --machine MACHINE "
            "[--role agent]), or name the directory with --deploy-dir"
        )
    one_per_device_type(artifacts)
    return distinct_file_names(artifacts)


def artifact_info(path: Path, machine: str, verify_key: Path | None) -> ArtifactInfo:
    details = read_mender(path)
    if not details["signed"]:
        raise ReleaseError(
            f"{path} is not signed (no manifest.sig): the images only install signed artifacts. "
            "Set MENDER_ARTIFACT_SIGNING_KEY (and MENDER_ARTIFACT_VERIFY_KEY) and rebuild (docs/fleet.md)"
        )
    payload_types = list(details["payload_types"])  # type: ignore[call-overload]
    check_payload(path, machine, payload_types)
    manifest = path.with_name(path.name.removesuffix(".mender") + ".manifest")
    if not manifest.is_file():
        manifest = provision.manifest_beside(path) or manifest
    key = check_signature(path, details, image_verify_key(manifest), verify_key)
    is_tegra = machine.startswith("jetson") or "tegra" in machine
    return ArtifactInfo(
        file=path.name,
        sha256=file_sha256(path),
        size_bytes=path.stat().st_size,
        artifact_name=str(details["artifact_name"]),
        device_types=list(details["device_types"]),  # type: ignore[call-overload]
        payload_types=payload_types,
        machine=machine,
        signed=True,
        role=provision.image_role(manifest),
        l4t_version=image_manifest_versions(manifest, L4T_PACKAGES) if is_tegra else None,
        k3s_version=image_manifest_versions(manifest, K3S_PACKAGES),
        verify_key_sha256=key.fingerprint,
        source=str(path),
    )


def image_verify_key(manifest: Path) -> Path:
    """Where the build recorded the verify key the image holds: beside its manifest
    (classes/gpu_k8s_mender.bbclass, gpu_k8s_deploy_verify_key)."""
    return manifest.with_name(preflight.deployed_verify_key_name(manifest.name))


def read_verify_key(path: Path, what: str) -> mender_signing.PublicKey:
    try:
        return mender_signing.verify_public_key(path.read_bytes(), path, what)
    except OSError as error:
        raise ReleaseError(f"{what} {path} cannot be read: {error.strerror or error}") from None
    except mender_signing.KeyProblem as problem:
        raise ReleaseError(f"{problem.reason}; fix: {problem.fix}") from None


def check_signature(path: Path, details: dict[str, object], recorded: Path,
                    verify_key: Path | None) -> mender_signing.PublicKey:
    """The key the artifact's signature verifies with: --verify-key (the key the boards hold,
    when it changed) or else the one the image holds. Raises ReleaseError when the signature
    would be rejected, or when nothing says which key the boards hold."""
    image_key = read_verify_key(recorded, "the image's verify key") if recorded.is_file() else None
    given = read_verify_key(verify_key, "--verify-key") if verify_key is not None else None
    key = given or image_key
    if key is None:
        raise ReleaseError(
            f"{path.name}: no record of the verify key its image holds ({recorded.name} beside its manifest; "
            "builds from before ./task build recorded it have none), so its signature cannot be checked: rebuild "
            "it, or give the key the boards hold with --verify-key FILE"
        )
    which = f"--verify-key {verify_key}" if given else f"the verify key the image holds, {recorded}"
    problem = mender_signing.signature_problem(details["manifest"], details["signature"], key)  # type: ignore[arg-type]
    if problem:
        raise ReleaseError(
            f"{path.name}: {problem} with {which} ({key.kind}, fingerprint {key.fingerprint}: "
            f"{mender_signing.FINGERPRINT_NAME}), so boards holding that key would refuse it. Sign with that key's "
            "private half (MENDER_ARTIFACT_SIGNING_KEY; ./task build checks the pair) and rebuild; if the boards "
            "hold another key, name it with --verify-key"
        )
    if given and image_key and given != image_key:
        console.warn(f"{path.name} is signed for boards holding --verify-key {verify_key}, but its image holds "
                     f"another verify key ({image_key.fingerprint[:16]}...): once updated, those boards take only "
                     "artifacts signed by that key's private half")
    return key


def distinct_file_names(artifacts: list[ArtifactInfo]) -> list[ArtifactInfo]:
    """A machine's server and agent images make artifacts of one name (IMAGE-MACHINE-DATETIME.mender,
    in two deploy dirs); in the release each such file is named with its role (else its device
    type, which one_per_device_type made unique), so neither overwrites the other."""
    counts = Counter(artifact.file for artifact in artifacts)
    renamed = []
    for artifact in artifacts:
        if counts[artifact.file] > 1:
            tag = artifact.role or "-".join(artifact.device_types)
            artifact = replace(artifact, file=f"{artifact.file.removesuffix('.mender')}-{tag}.mender")
        renamed.append(artifact)
    return renamed


def one_per_device_type(artifacts: list[ArtifactInfo]) -> None:
    """A rollout's Plans pick nodes by device type: two artifacts of one type would both reach
    the same nodes (a server image onto an agent, or the x86-64 image of two series)."""
    owners: dict[str, ArtifactInfo] = {}
    for artifact in artifacts:
        for device_type in artifact.device_types:
            first = owners.setdefault(device_type, artifact)
            if first is not artifact:
                raise ReleaseError(
                    f"{first.file} and {artifact.file} both install on device type {device_type}: a release holds "
                    "one artifact per device type, since the fleet's nodes are picked by it. Release one build "
                    "with --kas or --deploy-dir; a second role of one machine gets its own device type when built "
                    "with ./task build --role (MACHINE-agent or MACHINE-server)"
                )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------- writing the release


def release_version(artifacts: list[ArtifactInfo]) -> str:
    names = sorted({a.artifact_name for a in artifacts})
    if len(names) != 1:
        raise ReleaseError(
            f"the artifacts carry different names {names}: one release is one version; build every machine "
            "with the same GPU_K8S_VERSION, or release one with --kas"
        )
    return names[0]


def write_release(artifacts: list[ArtifactInfo], output: Path) -> Path:
    output.mkdir(parents=True, exist_ok=True)
    for artifact in artifacts:
        target = output / artifact.file
        if target.exists():
            if file_sha256(target) != artifact.sha256:
                raise ReleaseError(
                    f"{target} exists with other content: a released version never changes; "
                    "cut a new version (GPU_K8S_VERSION) or choose another --output"
                )
        else:
            temporary = target.with_name(f".{target.name}.partial")
            shutil.copyfile(artifact.source, temporary)
            os.replace(temporary, target)
        (output / f"{artifact.file}.sha256").write_text(f"{artifact.sha256}  {artifact.file}\n")
    sums = "".join(f"{a.sha256}  {a.file}\n" for a in sorted(artifacts, key=lambda a: a.file))
    (output / "SHA256SUMS").write_text(sums)
    manifest = {
        "version": release_version(artifacts),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "artifacts": [{k: v for k, v in asdict(a).items() if k != "source"} for a in artifacts],
    }
    (output / "release.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return output


def l4t_changes(artifacts: list[ArtifactInfo], releases_dir: Path, version: str) -> list[str]:
    """Earlier releases beside this one whose L4T differs for the same machine. The Nano's boot
    firmware is single-copy: rolling across an L4T change (or back) can brick a board."""
    changes = []
    for manifest in sorted(releases_dir.glob("*/release.json")):
        try:
            earlier = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        if earlier.get("version") == version:
            continue
        for old in earlier.get("artifacts") or []:
            for new in artifacts:
                if new.l4t_version and old.get("machine") == new.machine and old.get("l4t_version") not in (
                    None, new.l4t_version
                ):
                    changes.append(
                        f"{new.machine}: release {earlier.get('version')} has L4T {old['l4t_version']}, this one "
                        f"{new.l4t_version}: do not roll it over boards running {earlier.get('version')}; "
                        "reflash them (docs/fleet.md, the L4T rule)"
                    )
    return changes


def next_steps(version: str, output: Path, artifacts: list[ArtifactInfo]) -> list[str]:
    """The rollout that serves every device type of this release, one Plan pair each; a single
    artifact may also go by its URL."""
    steps = [f"then: ./task rollout --version {version} --release {output} --base-url http://HOST:8080/ "
             f"(one Plan pair per device type: {', '.join(t for a in artifacts for t in a.device_types)})"]
    if len(artifacts) == 1:
        steps.append(f"  or: ./task rollout --version {version} --artifact-url http://HOST:8080/{artifacts[0].file}")
    return steps


def run_release(options: ReleaseOptions) -> tuple[Path, list[ArtifactInfo]]:
    console.step("collecting signed Mender artifacts")
    artifacts = collect(options)
    version = release_version(artifacts)
    output = (options.output or BUILD_ROOT / "release" / version).absolute()
    write_release(artifacts, output)
    rows = [[a.machine, ", ".join(a.device_types), a.role or "-", ", ".join(a.payload_types), a.file,
             console.human_size(a.size_bytes), a.l4t_version or "-", a.k3s_version or "-", a.sha256[:16]]
            for a in artifacts]
    console.summary(f"release {version} in {output}",
                    ["machine", "device type", "role", "payload", "artifact", "size", "L4T", "k3s", "sha256"], rows)
    for change in l4t_changes(artifacts, output.parent, version):
        console.warn(change)
    console.info(f"serve it: python3 -m http.server --directory {output} 8080")
    for line in next_steps(version, output, artifacts):
        console.info(line)
    return output, artifacts
