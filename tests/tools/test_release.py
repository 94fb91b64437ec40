"""`./task release` on fake deploy directories holding Mender artifacts built the way
mender-artifact lays them out (outer tar: version, manifest, manifest.sig, header.tar.gz, data)."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tools import release

REPO_ROOT = Path(__file__).resolve().parents[2]

MACHINE = "jetson-nano-devkit"
LINK = f"gpu-k8s-image-{MACHINE}.mender"


def _tar_bytes(files: dict[str, bytes], compress: str = "") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=f"w:{compress}") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def make_artifact(path: Path, name: str = "1.4.0", signed: bool = True, corrupt: bool = False,
                  device_type: str = MACHINE) -> Path:
    header_info = {"payloads": [{"type": "rootfs-image"}],
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


def deploy_dir(tmp_path: Path, **artifact: object) -> Path:
    """A deploy dir as bitbake leaves it: timestamped files and stable-name links."""
    directory = tmp_path / "deploy" / MACHINE
    directory.mkdir(parents=True)
    stem = f"gpu-k8s-image-{MACHINE}-20261123220000.rootfs"
    old = make_artifact(directory / f"gpu-k8s-image-{MACHINE}-20261101000000.rootfs.mender", name="1.3.0")
    assert old.exists()
    make_artifact(directory / f"{stem}.mender", **artifact)  # type: ignore[arg-type]
    (directory / LINK).symlink_to(f"{stem}.mender")
    (directory / f"{stem}.manifest").write_text(
        "busybox cortexa57 1.35.0-r0\nk3s-server cortexa57 v1.28.15+k3s1-r0\n"
        "nv-tegra-release jetson_nano_devkit 32.7.6-r0\npython3 cortexa57 3.10.15-r0\n"
    )
    (directory / f"gpu-k8s-image-{MACHINE}.manifest").symlink_to(f"{stem}.manifest")
    return directory


def test_release_holds_the_newest_signed_artifact_its_sha256_and_a_manifest(tmp_path: Path) -> None:
    source = deploy_dir(tmp_path)
    output, artifacts = release.run_release(release.ReleaseOptions(deploy_dir=source, output=tmp_path / "out"))
    assert [a.file for a in artifacts] == [f"gpu-k8s-image-{MACHINE}-20261123220000.rootfs.mender"], (
        "only what the stable link points at (the newest build) is released"
    )
    released = output / artifacts[0].file
    digest = hashlib.sha256(released.read_bytes()).hexdigest()
    assert (output / f"{artifacts[0].file}.sha256").read_text() == f"{digest}  {artifacts[0].file}\n"
    assert (output / "SHA256SUMS").read_text() == f"{digest}  {artifacts[0].file}\n"
    manifest = json.loads((output / "release.json").read_text())
    assert manifest["version"] == "1.4.0"
    entry = manifest["artifacts"][0]
    assert entry["artifact_name"] == "1.4.0" and entry["machine"] == MACHINE and entry["signed"] is True
    assert entry["l4t_version"] == "32.7.6" and entry["k3s_version"] == "v1.28.15+k3s1"
    assert entry["device_types"] == [MACHINE] and entry["payload_types"] == ["rootfs-image"]
    assert entry["sha256"] == digest and "source" not in entry
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=output, capture_output=True, text=True,
                           check=False)
    assert check.returncode == 0, check.stdout + check.stderr


def test_an_l4t_change_against_an_earlier_release_is_warned_about(tmp_path: Path, capsys) -> None:
    releases = tmp_path / "releases"
    earlier = releases / "1.3.0"
    earlier.mkdir(parents=True)
    (earlier / "release.json").write_text(json.dumps(
        {"version": "1.3.0", "artifacts": [{"machine": MACHINE, "l4t_version": "32.7.4"}]}))
    release.run_release(release.ReleaseOptions(deploy_dir=deploy_dir(tmp_path), output=releases / "1.4.0"))
    out = capsys.readouterr().out
    assert "release 1.3.0 has L4T 32.7.4, this one 32.7.6" in out and "reflash" in out
    (earlier / "release.json").write_text(json.dumps(
        {"version": "1.3.0", "artifacts": [{"machine": MACHINE, "l4t_version": "32.7.6"}]}))
    release.run_release(release.ReleaseOptions(deploy_dir=tmp_path / "deploy" / MACHINE,
                                               output=releases / "1.4.0"))
    assert "has L4T" not in capsys.readouterr().out, "same L4T: nothing to warn about"


def test_an_unsigned_artifact_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    source = deploy_dir(tmp_path, signed=False)
    with pytest.raises(release.ReleaseError, match="is not signed.*MENDER_ARTIFACT_SIGNING_KEY"):
        release.run_release(release.ReleaseOptions(deploy_dir=source, output=tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_corrupt_artifact_is_refused(tmp_path: Path) -> None:
    source = deploy_dir(tmp_path, corrupt=True)
    with pytest.raises(release.ReleaseError, match="corrupt: data/0000.tar.gz"):
        release.run_release(release.ReleaseOptions(deploy_dir=source, output=tmp_path / "out"))


def test_nothing_built_says_where_it_looked_and_what_to_run(tmp_path: Path) -> None:
    empty = tmp_path / "deploy"
    empty.mkdir()
    with pytest.raises(release.ReleaseError, match=r"nothing to release: no \.mender artifact in .*\./task build"):
        release.run_release(release.ReleaseOptions(deploy_dir=empty))


def test_a_deploy_dir_that_does_not_exist_is_named_as_a_path_problem_not_a_missing_build(tmp_path: Path) -> None:
    with pytest.raises(release.ReleaseError) as refused:
        release.run_release(release.ReleaseOptions(deploy_dir=tmp_path / "dpeloy"))
    message = str(refused.value)
    assert message.startswith(f"--deploy-dir {tmp_path / 'dpeloy'} is not a directory")
    assert "./task build" not in message and "\n" not in message


def test_a_file_that_is_not_an_artifact_is_named(tmp_path: Path) -> None:
    directory = tmp_path / "deploy"
    directory.mkdir()
    (directory / "broken.mender").write_text("not a tar")
    with pytest.raises(release.ReleaseError, match="broken.mender is not a Mender artifact"):
        release.run_release(release.ReleaseOptions(deploy_dir=directory))


def test_a_released_version_never_changes(tmp_path: Path) -> None:
    source = deploy_dir(tmp_path)
    out = tmp_path / "out"
    release.run_release(release.ReleaseOptions(deploy_dir=source, output=out))
    release.run_release(release.ReleaseOptions(deploy_dir=source, output=out))  # same bytes: fine
    target = next(out.glob("*.mender"))
    target.write_bytes(b"other")
    with pytest.raises(release.ReleaseError, match="exists with other content"):
        release.run_release(release.ReleaseOptions(deploy_dir=source, output=out))


def test_kas_file_picks_that_machines_deploy_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build_dir = tmp_path / "nano-build"
    deploy = build_dir / "build" / "tmp" / "deploy" / "images"
    deploy.mkdir(parents=True)
    (deploy / MACHINE).symlink_to(deploy_dir(tmp_path))
    monkeypatch.delenv("TMPDIR", raising=False)
    monkeypatch.delenv("KAS_BUILD_DIR", raising=False)
    _, artifacts = release.run_release(
        release.ReleaseOptions(kas="kas/jetson-nano.yml", build_dir=build_dir, output=tmp_path / "out"))
    assert artifacts[0].machine == MACHINE and artifacts[0].l4t_version == "32.7.6"
    with pytest.raises(release.ReleaseError, match="not one of our kas files"):
        release.run_release(release.ReleaseOptions(kas="kas/nope.yml"))


def test_verify_key_without_mender_artifact_is_a_clear_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(release.ReleaseError, match="needs mender-artifact on PATH"):
        release.run_release(release.ReleaseOptions(deploy_dir=deploy_dir(tmp_path), verify_key=tmp_path / "k.pem"))


def test_task_reports_an_unsigned_artifact_in_one_line(tmp_path: Path) -> None:
    source = deploy_dir(tmp_path, signed=False)
    completed = subprocess.run(
        [sys.executable, "-m", "invoke", "--search-root", str(REPO_ROOT), "release", "--deploy-dir", str(source),
         "--output", str(tmp_path / "out")],
        capture_output=True, text=True, check=False,
    )
    assert completed.returncode == 1
    assert completed.stderr.count("\n") == 1 and "is not signed" in completed.stderr
