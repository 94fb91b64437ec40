"""build: before kas starts, the A/B image's update-signing keys are read as mender-artifact and
the Mender client read them and must be one pair, key paths are taken from where ./task was
run, and the release version must be one rollout takes; the dry run shows what is baked in.
Keys are made in the test; a stand-in kas records whether any build work started."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from signing_keys import KeyFiles, ec_key, private_pem, public_pem, rsa_key, write_pair

from tools import mender_signing
from tools.image import build, hostcheck

REPO_ROOT = Path(__file__).resolve().parents[2]
GIB = 1024**3
SIGNING, VERIFY = "MENDER_ARTIFACT_SIGNING_KEY", "MENDER_ARTIFACT_VERIFY_KEY"


@pytest.fixture
def ab_build(tmp_path: Path, stand_ins, monkeypatch: pytest.MonkeyPatch):
    """`./task build --machine x86-64` (an A/B image whose artifacts must be signed) on a host
    that passes its other checks; returns run(environ, dry_run) -> (error or None, output)."""
    stand_ins.add("kas", "print('kas ran')\n")
    monkeypatch.setattr(build, "kas_executable", lambda: "kas")
    monkeypatch.setattr(hostcheck, "gather_host_facts", lambda path: hostcheck.HostFacts(
        path, free_bytes=500 * GIB, euid=1000, locales=("en_US.utf8",)))
    monkeypatch.setattr(hostcheck, "check_host_tools", lambda which=None: [])
    options = build.BuildOptions(machine="x86-64", build_dir=tmp_path / "x86", accept_nvidia_licence=True)

    def run(environ: dict[str, str], dry_run: bool = False, capsys=None) -> tuple[build.BuildError | None, str]:
        try:
            build.run_build(replace(options, dry_run=dry_run), environ=environ)
            error = None
        except build.BuildError as refused:
            error = refused
        return error, capsys.readouterr().out if capsys else ""

    run.kas_calls = lambda: stand_ins.calls("kas")  # type: ignore[attr-defined]
    return run


def keys_env(keys: KeyFiles) -> dict[str, str]:
    return {SIGNING: str(keys.private), VERIFY: str(keys.public)}


def refused_before_kas(ab_build, capsys, environ: dict[str, str]) -> str:
    """The build refuses, a real one before kas and the dry run too; the output of both."""
    error, out = ab_build(environ, capsys=capsys)
    assert error is not None and "cannot build yet" in str(error), out
    assert ab_build.kas_calls() == [], "no build work started"
    dry_error, dry_out = ab_build(environ, dry_run=True, capsys=capsys)
    assert dry_error is not None and "dry run: a real build would stop" in str(dry_error), dry_out
    return out + dry_out


@pytest.mark.parametrize(("kind", "traditional"), [("ecdsa", False), ("rsa", True)])
def test_a_pair_passes_and_the_dry_run_shows_the_version_and_both_fingerprints(
        tmp_path: Path, ab_build, capsys, kind, traditional) -> None:
    key = ec_key() if kind == "ecdsa" else rsa_key()
    keys = write_pair(tmp_path / "keys", key, traditional=traditional)
    error, out = ab_build({**keys_env(keys), "GPU_K8S_VERSION": "1.4.0+build.7"}, dry_run=True, capsys=capsys)
    assert error is None, out
    fingerprint = mender_signing.verify_public_key(public_pem(key), keys.public).fingerprint
    assert "release version 1.4.0+build.7 (GPU_K8S_VERSION from the environment)" in out
    assert f"{SIGNING} {keys.private}: {'ECDSA P-256' if kind == 'ecdsa' else 'RSA 2048'}, fingerprint {fingerprint}" \
        in out
    assert f"{VERIFY} {keys.public}: " in out and out.count(f"fingerprint {fingerprint}") == 2
    assert "SHA-256 of the public key's DER SubjectPublicKeyInfo" in out and "the two match: one pair" in out
    error, out = ab_build(keys_env(keys), capsys=capsys)
    assert error is None and ab_build.kas_calls(), "a real build runs kas"
    assert "release version dev (GPU_K8S_VERSION from the layer's default)" in out


def test_a_garbage_signing_key_is_refused_before_kas(tmp_path: Path, ab_build, capsys) -> None:
    keys = write_pair(tmp_path / "keys", ec_key())
    keys.private.write_bytes(os.urandom(8))
    out = refused_before_kas(ab_build, capsys, keys_env(keys))
    assert f"- {SIGNING} ({keys.private}) is not a PEM private key" in out
    assert "fix: make a new pair: openssl genpkey -algorithm EC" in out


@pytest.mark.parametrize(("signing", "verify", "kinds"), [
    (lambda: rsa_key(), lambda: rsa_key(3072), " (RSA 2048 and RSA 3072)"),
    (lambda: ec_key(), lambda: ec_key(), ""),
    (lambda: rsa_key(), lambda: ec_key(), " (RSA 2048 and ECDSA P-256)"),
], ids=["rsa", "ecdsa", "rsa-private-ecdsa-verify"])
def test_a_private_key_and_a_verify_key_of_two_pairs_are_refused_before_kas(
        tmp_path: Path, ab_build, capsys, signing, verify, kinds) -> None:
    private, public = tmp_path / "signing.key", tmp_path / "verify.pem"
    private.write_bytes(private_pem(signing()))
    public.write_bytes(public_pem(verify()))
    out = refused_before_kas(ab_build, capsys, {SIGNING: str(private), VERIFY: str(public)})
    assert f"- {SIGNING} ({private}) and {VERIFY} ({public}) are not one pair{kinds}: public key fingerprints" in out
    assert f"fix: derive the verify key from the signing key: openssl pkey -in {private} -pubout -out {public}" in out


def test_a_key_type_mender_artifact_cannot_sign_with_is_refused_before_kas(tmp_path: Path, ab_build, capsys) -> None:
    from cryptography.hazmat.primitives.asymmetric import ed25519

    keys = write_pair(tmp_path / "keys", ed25519.Ed25519PrivateKey.generate())  # type: ignore[arg-type]
    out = refused_before_kas(ab_build, capsys, keys_env(keys))
    assert f"{SIGNING} ({keys.private}) is a key of type Ed25519: mender-artifact signs only with RSA or ECDSA" in out


def test_a_missing_key_file_is_named_before_kas(tmp_path: Path, ab_build, capsys) -> None:
    keys = write_pair(tmp_path / "keys", ec_key())
    keys.public.unlink()
    out = refused_before_kas(ab_build, capsys, keys_env(keys))
    assert f"{VERIFY} names {keys.public}, which is not a file" in out


def test_relative_key_paths_are_taken_from_where_task_ran_and_passed_on_absolute(
        tmp_path: Path, ab_build, capsys, monkeypatch) -> None:
    work = tmp_path / "work"
    keys = write_pair(work / "keys", ec_key())
    relative = {SIGNING: "keys/fleet-private.pem", VERIFY: "./keys/fleet-public.pem"}
    monkeypatch.chdir(work)
    error, out = ab_build(relative, dry_run=True, capsys=capsys)
    assert error is None, out
    (kas_line,) = [line for line in out.splitlines() if "would run:" in line and "kas build" in line]
    assert f" {SIGNING}={keys.private} " in kas_line and f" {VERIFY}={work}/keys/fleet-public.pem " in kas_line
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    out = refused_before_kas(ab_build, capsys, relative)
    assert f"{SIGNING} names {elsewhere}/keys/fleet-private.pem, which is not a file" in out


def test_a_relative_key_path_in_site_conf_is_refused_with_the_fix(tmp_path: Path, ab_build, capsys) -> None:
    site = tmp_path / "x86" / "build" / "conf" / "site.conf"
    site.parent.mkdir(parents=True)
    site.write_text(f'{SIGNING} = "keys/fleet-private.pem"\n{VERIFY} = "keys/fleet-public.pem"\n')
    out = refused_before_kas(ab_build, capsys, {})
    assert f"{SIGNING} (keys/fleet-private.pem) is a relative path" in out and "give it as an absolute path" in out


def test_a_version_rollout_would_refuse_is_refused_at_build_with_the_rule_and_a_valid_one(
        tmp_path: Path, ab_build, capsys) -> None:
    keys = write_pair(tmp_path / "keys", ec_key())
    out = refused_before_kas(ab_build, capsys, {**keys_env(keys), "GPU_K8S_VERSION": "1.0 beta"})
    assert ("- GPU_K8S_VERSION (from the environment) '1.0 beta' must be 1-63 letters, digits, '.', '_', '+' or '-', "
            "starting and ending with a letter or digit (it becomes a Kubernetes label value), e.g. 1.4.0") in out
    assert "fix: set a valid one, e.g. GPU_K8S_VERSION=1.0-beta ./task build" in out
    site = tmp_path / "x86" / "build" / "conf" / "site.conf"
    site.parent.mkdir(parents=True)
    site.write_text('GPU_K8S_VERSION = "release/2"\n')  # site.conf's = wins over the environment, as in bitbake
    out = refused_before_kas(ab_build, capsys, {**keys_env(keys), "GPU_K8S_VERSION": "1.4.0"})
    assert f"GPU_K8S_VERSION (from {site}) 'release/2' must be" in out


def test_task_build_from_another_directory_resolves_the_keys_there(tmp_path: Path) -> None:
    """What ./task runs (tools/program.py under invoke, which changes no directory), in a
    child process started where the person is: the kas command line carries absolute paths."""
    work = tmp_path / "work"
    keys = write_pair(work / "keys", ec_key())
    env = {**os.environ, SIGNING: "keys/fleet-private.pem", VERIFY: "keys/fleet-public.pem"}
    env.pop("KAS_BUILD_DIR", None)
    env.pop("KAS_WORK_DIR", None)
    completed = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "program.py"), "--search-root", str(REPO_ROOT), "build",
         "--machine", "x86-64", "--accept-nvidia-licence", "--dry-run", "--build-dir", str(tmp_path / "b")],
        cwd=work, env=env, capture_output=True, text=True, check=False)
    out = completed.stdout
    assert f"{SIGNING}={keys.private}" in out and f"{VERIFY}={keys.public}" in out, out + completed.stderr
    assert f"{SIGNING} {keys.private}: ECDSA P-256, fingerprint" in out


def test_a_key_file_the_builder_cannot_read_is_named_with_the_fix(tmp_path: Path, monkeypatch) -> None:
    """(As root every file is readable: the refusal is made to happen by the read itself.)"""
    from tools.image import preflight

    keys = write_pair(tmp_path / "keys", ec_key())
    real_read = Path.read_bytes

    def read_bytes(path: Path) -> bytes:
        if path == keys.private:
            raise PermissionError(13, "Permission denied", str(path))
        return real_read(path)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    settings = {name: preflight.Setting(str(path), "the environment")
                for name, path in ((SIGNING, keys.private), (VERIFY, keys.public))}
    found, (problem,) = preflight.read_keys(settings)
    assert [key.variable for key in found] == [VERIFY]
    assert problem.reason == f"{SIGNING} ({keys.private}) cannot be read: Permission denied"
    assert problem.fix.startswith("make it readable by the user who builds")
