"""`./task release` on fake deploy directories holding Mender artifacts built the way
mender-artifact lays them out (outer tar: version, manifest, manifest.sig, header.tar.gz, data)."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from mender_artifacts import make_artifact, record_verify_key
from signing_keys import ec_key, fleet_key, public_pem, rsa_key, write_pair

from tools import mender_signing
from tools.fleet import release
from tools.image import build

REPO_ROOT = Path(__file__).resolve().parents[2]

MACHINE = "jetson-nano-devkit"
LINK = f"gpu-k8s-image-{MACHINE}.mender"


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
    record_verify_key(directory / f"{stem}.manifest")
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
    with pytest.raises(release.ReleaseError, match="corrupt: data/0000/rootfs.ext4 does not match its manifest"):
        release.run_release(release.ReleaseOptions(deploy_dir=source, output=tmp_path / "out"))


def test_nothing_built_says_where_it_looked_and_what_to_run(tmp_path: Path) -> None:
    empty = tmp_path / "deploy"
    empty.mkdir()
    with pytest.raises(release.ReleaseError, match=r"nothing to release: .*deploy \(--deploy-dir\) holds no \.mender "
                       r"artifact.*\./task build"):
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
    with pytest.raises(release.ReleaseUsageError, match="not one of our kas files"):
        release.run_release(release.ReleaseOptions(kas="kas/nope.yml"))


# ---------------------------------------------------------------- signatures


def test_an_artifact_signed_by_another_key_than_its_image_holds_is_refused_naming_it_and_the_key(
        tmp_path: Path) -> None:
    """The build signed with one key and recorded another as the image's verify key: every board
    updated to it would refuse what it was signed with."""
    source = deploy_dir(tmp_path, key=ec_key())
    with pytest.raises(release.ReleaseError) as refused:
        release.run_release(release.ReleaseOptions(deploy_dir=source, output=tmp_path / "out"))
    message = str(refused.value)
    fingerprint = mender_signing.verify_public_key(public_pem(fleet_key()), Path("k")).fingerprint
    assert message.startswith(f"gpu-k8s-image-{MACHINE}-20261123220000.rootfs.mender: its signature does not verify")
    assert (f"does not verify with the verify key the image holds, {source}/gpu-k8s-image-{MACHINE}-20261123220000"
            f".rootfs.artifact-verify-key.pem (ECDSA P-256, fingerprint {fingerprint}: SHA-256") in message
    assert "so boards holding that key would refuse it" in message and "MENDER_ARTIFACT_SIGNING_KEY" in message
    assert not (tmp_path / "out").exists(), "nothing released"


@pytest.mark.parametrize("kind", ["rsa", "ecdsa"])
def test_an_artifact_signed_with_the_key_its_image_holds_is_released_with_that_keys_fingerprint(
        tmp_path: Path, kind: str) -> None:
    key = rsa_key() if kind == "rsa" else ec_key()
    source = deploy_dir(tmp_path, key=key)
    record_verify_key(next(source.glob("*20261123220000.rootfs.manifest")), key)
    output, (artifact,) = release.run_release(release.ReleaseOptions(deploy_dir=source, output=tmp_path / "out"))
    expected = mender_signing.verify_public_key(public_pem(key), Path("k")).fingerprint
    assert artifact.verify_key_sha256 == expected
    assert json.loads((output / "release.json").read_text())["artifacts"][0]["verify_key_sha256"] == expected


def test_a_signature_that_is_not_mender_artifacts_base64_is_refused(tmp_path: Path) -> None:
    source = deploy_dir(tmp_path)
    link = source / LINK
    artifact = link.resolve()
    with tarfile.open(artifact) as archive:
        members = {m.name: archive.extractfile(m).read() for m in archive.getmembers()}  # type: ignore[union-attr]
    members["manifest.sig"] += b"\n"  # the client's base64 decoder takes no trailing newline
    with tarfile.open(artifact, "w") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    with pytest.raises(release.ReleaseError, match=r"manifest\.sig is not base64"):
        release.run_release(release.ReleaseOptions(deploy_dir=source, output=tmp_path / "out"))


def test_without_a_record_of_the_images_key_release_refuses_unless_verify_key_names_the_boards_key(
        tmp_path: Path) -> None:
    source = deploy_dir(tmp_path)
    for record in source.glob("*.artifact-verify-key.pem"):
        record.unlink()
    with pytest.raises(release.ReleaseError, match=r"no record of the verify key its image holds .*rebuild it, or "
                                                   r"give the key the boards hold with --verify-key FILE"):
        release.run_release(release.ReleaseOptions(deploy_dir=source, output=tmp_path / "out"))
    boards = write_pair(tmp_path / "keys", fleet_key())
    _, (artifact,) = release.run_release(release.ReleaseOptions(deploy_dir=source, output=tmp_path / "out",
                                                                verify_key=boards.public))
    assert artifact.signed
    wrong = write_pair(tmp_path / "other", ec_key())
    with pytest.raises(release.ReleaseError, match=f"does not verify with --verify-key {wrong.public} \\(ECDSA P-256"):
        release.run_release(release.ReleaseOptions(deploy_dir=source, output=tmp_path / "out2",
                                                   verify_key=wrong.public))


def test_verify_key_is_the_key_the_boards_hold_when_the_new_image_carries_another(tmp_path: Path, capsys) -> None:
    """A key change: the release is signed with the old key (what the boards hold now), its
    image carries the new verify key."""
    source = deploy_dir(tmp_path)
    new_key = ec_key()
    record_verify_key(next(source.glob("*20261123220000.rootfs.manifest")), new_key)
    with pytest.raises(release.ReleaseError, match="its signature does not verify"):
        release.run_release(release.ReleaseOptions(deploy_dir=source, output=tmp_path / "out"))
    boards = write_pair(tmp_path / "keys", fleet_key())
    release.run_release(release.ReleaseOptions(deploy_dir=source, output=tmp_path / "out", verify_key=boards.public))
    assert "but its image holds another verify key" in capsys.readouterr().out


def test_a_verify_key_that_is_no_public_key_is_named(tmp_path: Path) -> None:
    private = write_pair(tmp_path / "keys", fleet_key()).private
    with pytest.raises(release.ReleaseError, match=r"--verify-key \(.*\) is a private key"):
        release.run_release(release.ReleaseOptions(deploy_dir=deploy_dir(tmp_path), output=tmp_path / "out",
                                                   verify_key=private))


needs_mender_artifact = pytest.mark.skipif(
    shutil.which("mender-artifact") is None,
    reason="mender-artifact is not installed (./task test installs Debian's as root; apt-get install mender-artifact)")


@needs_mender_artifact
@pytest.mark.parametrize("kind", ["rsa", "ecdsa"])
def test_release_takes_what_real_mender_artifact_signs_only_with_the_key_it_signed_with(tmp_path: Path,
                                                                                       kind: str) -> None:
    """An artifact written and signed by mender-artifact itself (Debian's 3.9.0: the same signer.go
    for a key file as our pins' 4.0.0 and 4.4.1; PKCS#1/SEC1 keys, which it reads)."""
    key = rsa_key() if kind == "rsa" else ec_key()
    keys = write_pair(tmp_path / "keys", key, traditional=True)
    directory = tmp_path / "deploy" / MACHINE
    directory.mkdir(parents=True)
    (tmp_path / "rootfs.ext4").write_bytes(bytes(range(256)) * 64)
    stem = f"gpu-k8s-image-{MACHINE}-20261123220000"
    written = subprocess.run(
        ["mender-artifact", "write", "rootfs-image", "-t", MACHINE, "-n", "1.4.0", "-f", str(tmp_path / "rootfs.ext4"),
         "-k", str(keys.private), "-o", str(directory / f"{stem}.mender")], capture_output=True, text=True, check=False)
    assert written.returncode == 0, written.stderr
    (directory / f"{stem}.manifest").write_text("k3s-agent x 1.36.4\n")
    record_verify_key(directory / f"{stem}.manifest", key)
    _, (artifact,) = release.run_release(release.ReleaseOptions(deploy_dir=directory, output=tmp_path / "out"))
    assert artifact.device_types == [MACHINE] and artifact.artifact_name == "1.4.0"
    record_verify_key(directory / f"{stem}.manifest", ec_key())
    with pytest.raises(release.ReleaseError, match="its signature does not verify"):
        release.run_release(release.ReleaseOptions(deploy_dir=directory, output=tmp_path / "out2"))


@needs_mender_artifact
@pytest.mark.parametrize("kind", ["rsa", "ecdsa"])
def test_real_mender_artifact_validates_the_test_artifacts_as_release_does(tmp_path: Path, kind: str) -> None:
    """The fake builds' artifacts are real ones: mender-artifact accepts their layout and
    signature with the right key and refuses them with another, as release does."""
    key = rsa_key() if kind == "rsa" else ec_key()
    artifact = make_artifact(tmp_path / "a.mender", key=key)
    right, wrong = write_pair(tmp_path / "right", key), write_pair(tmp_path / "wrong", ec_key())
    for keys, accepted in ((right, True), (wrong, False)):
        validated = subprocess.run(["mender-artifact", "validate", "-k", str(keys.public), str(artifact)],
                                   capture_output=True, text=True, check=False)
        assert (validated.returncode == 0) == accepted, validated.stdout + validated.stderr
        details = release.read_mender(artifact)
        verdict = mender_signing.signature_problem(details["manifest"], details["signature"],  # type: ignore[arg-type]
                                                   release.read_verify_key(keys.public, "key"))
        assert (verdict == "") == accepted, verdict


@pytest.mark.parametrize(("artifact", "said"), [({"signed": False}, "is not signed"),
                                                ({"key": "another"}, "its signature does not verify")],
                         ids=["unsigned", "signed-by-another-key"])
def test_task_reports_an_unsigned_or_wrongly_signed_artifact_in_one_line(tmp_path: Path, artifact, said) -> None:
    source = deploy_dir(tmp_path, **({"key": ec_key()} if artifact.get("key") else artifact))
    completed = subprocess.run(
        [sys.executable, "-m", "invoke", "--search-root", str(REPO_ROOT), "release", "--deploy-dir", str(source),
         "--output", str(tmp_path / "out")],
        capture_output=True, text=True, check=False,
    )
    assert completed.returncode == 1
    assert completed.stderr.count("\n") == 1 and said in completed.stderr, completed.stderr


# ---------------------------------------------------------------- the Orin, roles, a mixed fleet

ORIN = "jetson-orin-nano-devkit-nvme"


def built(build_root: Path, machine_dir: str, yocto_machine: str, device_type: str, payload: str = "rootfs-image",
          role: str = "server", name: str = "1.4.0") -> Path:
    """A deploy dir where ./task build leaves it, holding what the image's Mender scheme makes:
    IMAGE-MACHINE-DATETIME.mender (meta-mender empties IMAGE_NAME_SUFFIX; the native scheme
    names its module image the same) and the stable link IMAGE-MACHINE.mender beside it."""
    directory = build_root / machine_dir / "build" / "tmp" / "deploy" / "images" / yocto_machine
    directory.mkdir(parents=True)
    stem = f"gpu-k8s-image-{yocto_machine}-20261201120000"
    make_artifact(directory / f"{stem}.mender", name=name, device_type=device_type, payload_type=payload)
    (directory / f"gpu-k8s-image-{yocto_machine}.mender").symlink_to(f"{stem}.mender")
    (directory / f"{stem}.manifest").write_text(f"k3s-{role} x 1.36.4\nk3s x 1.36.4\n")
    record_verify_key(directory / f"{stem}.manifest")
    return directory


@pytest.fixture
def build_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "build"
    monkeypatch.setattr(release.build, "BUILD_ROOT", root)
    monkeypatch.setattr(release, "BUILD_ROOT", root)
    for name in ("KAS_WORK_DIR", "KAS_BUILD_DIR", "TMPDIR"):
        monkeypatch.delenv(name, raising=False)
    return root


def test_the_orins_native_artifact_is_released_with_its_device_and_payload_type(build_root: Path) -> None:
    built(build_root, "jetson-orin-nano-agent", ORIN, f"{ORIN}-agent", "tegra-rootfs-image", role="agent")
    _, artifacts = release.run_release(release.ReleaseOptions(kas="kas/jetson-orin-nano.yml"))
    (orin,) = artifacts
    assert (orin.machine, orin.device_types, orin.payload_types, orin.role) == (
        ORIN, [f"{ORIN}-agent"], ["tegra-rootfs-image"], "agent")
    manifest = json.loads((build_root / "release" / "1.4.0" / "release.json").read_text())
    assert manifest["artifacts"][0]["payload_types"] == ["tegra-rootfs-image"]
    assert manifest["artifacts"][0]["role"] == "agent"


THOR, T4000 = "jetson-agx-thor-devkit", "jetson-agx-thor-t4000"


def test_thor_releases_one_native_artifact_per_module_and_role_with_its_own_device_type(build_root: Path) -> None:
    # ./task build --machine jetson-agx-thor[-t4000] [--role agent]: the Mender device type is the
    # MACHINE, "-agent" appended for the role that is not the machine's default (kas/include/agent.yml)
    built(build_root, "jetson-agx-thor", THOR, THOR, "tegra-rootfs-image")
    built(build_root, "jetson-agx-thor-agent", THOR, f"{THOR}-agent", "tegra-rootfs-image", role="agent")
    built(build_root, "jetson-agx-thor-t4000-agent", T4000, f"{T4000}-agent", "tegra-rootfs-image", role="agent")
    _, artifacts = release.run_release(release.ReleaseOptions())
    assert sorted((a.machine, tuple(a.device_types), a.role) for a in artifacts) == [
        (THOR, (THOR,), "server"), (THOR, (f"{THOR}-agent",), "agent"), (T4000, (f"{T4000}-agent",), "agent")]
    assert {tuple(a.payload_types) for a in artifacts} == {("tegra-rootfs-image",)}
    # the devkit's server and agent images made artifacts of one name: each keeps its own in the release
    stem = f"gpu-k8s-image-{THOR}-20261201120000"
    assert sorted(a.file for a in artifacts if a.machine == THOR) == [f"{stem}-agent.mender", f"{stem}-server.mender"]
    released = build_root / "release" / "1.4.0"
    assert {p.name for p in released.glob("*.mender")} == {a.file for a in artifacts}
    listed = json.loads((released / "release.json").read_text())["artifacts"]
    assert {entry["file"]: entry["device_types"] for entry in listed}[f"{stem}-agent.mender"] == [f"{THOR}-agent"]


@pytest.mark.parametrize(("machine_dir", "yocto_machine", "payload"), [
    ("jetson-orin-nano", ORIN, "rootfs-image"),  # the classic scheme's, which a native board cannot install
    ("jetson-agx-thor", THOR, "rootfs-image"),
    ("jetson-agx-thor-t4000", T4000, "rootfs-image"),
    ("x86-64", "genericx86-64", "tegra-rootfs-image"),
])
def test_an_artifact_of_the_other_mender_scheme_is_refused(build_root: Path, machine_dir, yocto_machine,
                                                           payload) -> None:
    built(build_root, machine_dir, yocto_machine, yocto_machine, payload)
    with pytest.raises(release.ReleaseError, match=f"carries payload {payload}, but {yocto_machine} boards install"):
        release.run_release(release.ReleaseOptions())
    assert not (build_root / "release").exists()


def test_two_artifacts_for_one_device_type_are_refused(build_root: Path) -> None:
    built(build_root, "x86-64", "genericx86-64", "genericx86-64")
    built(build_root, "x86-64-scarthgap", "genericx86-64", "genericx86-64")
    with pytest.raises(release.ReleaseError, match="both install on device type genericx86-64: a release holds one"):
        release.run_release(release.ReleaseOptions())


def test_a_mixed_release_suggests_the_rollout_of_every_device_type(build_root: Path, capsys) -> None:
    built(build_root, "x86-64", "genericx86-64", "genericx86-64")
    built(build_root, "jetson-nano", MACHINE, MACHINE, role="agent")
    output, artifacts = release.run_release(release.ReleaseOptions())
    assert sorted(a.machine for a in artifacts) == ["genericx86-64", MACHINE]
    out = capsys.readouterr().out
    assert (f"then: ./task rollout --version 1.4.0 --release {output} --base-url http://HOST:8080/ (one Plan pair "
            "per device type:") in out
    assert "--artifact-url" not in out, "one artifact's URL would roll out to one device type only"


def test_a_single_artifact_release_also_names_its_url(tmp_path: Path, capsys) -> None:
    output, artifacts = release.run_release(release.ReleaseOptions(deploy_dir=deploy_dir(tmp_path),
                                                                   output=tmp_path / "out"))
    out = capsys.readouterr().out
    assert f"--release {output} --base-url http://HOST:8080/" in out
    assert f"or: ./task rollout --version 1.4.0 --artifact-url http://HOST:8080/{artifacts[0].file}" in out


def test_nothing_to_release_names_built_dirs_without_artifacts_and_counts_the_rest(build_root: Path) -> None:
    orin = build_root / "jetson-orin-nano" / "build" / "tmp" / "deploy" / "images" / ORIN
    orin.mkdir(parents=True)
    (orin / f"gpu-k8s-image-{ORIN}.tegraflash-tar.zst").write_bytes(b"")
    with pytest.raises(release.ReleaseError) as refused:
        release.run_release(release.ReleaseOptions())
    message = str(refused.value)
    assert message.startswith(f"nothing to release: {orin} (--machine jetson-orin-nano) holds no .mender artifact")
    others = len(build.MACHINES) * len(build.ROLES) - 1  # every machine's build per role, but the Orin's one
    assert f"; the {others} other machine and role builds do not exist." in message
    assert message.count("/deploy/images/") == 1, "unbuilt machines are not listed as if they were candidates"
    shutil.rmtree(build_root / "jetson-orin-nano")
    with pytest.raises(release.ReleaseError, match=f"nothing to release: no machine has been built under {build_root} "
                       r"yet\. Build first"):
        release.run_release(release.ReleaseOptions())
