"""The update-signing keys read as mender-artifact and the Mender client read them
(tools/mender_signing.py), with keys made in the test; what real mender-artifact does with the
same files is checked where it is installed."""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed25519
from signing_keys import ec_key, private_pem, public_pem, rsa_key, sign_manifest, write_pair

from tools import mender_signing

KEY = Path("/keys/signing.key")
VERIFY = Path("/keys/verify.pem")


def refusal(data: bytes, reader=mender_signing.signing_public_key) -> mender_signing.KeyProblem:
    with pytest.raises(mender_signing.KeyProblem) as refused:
        reader(data, KEY if reader is mender_signing.signing_public_key else VERIFY)
    return refused.value


@pytest.mark.parametrize("traditional", [False, True], ids=["pkcs8", "traditional"])
@pytest.mark.parametrize("kind", ["rsa", "ecdsa"])
def test_both_halves_of_a_pair_have_one_fingerprint_whatever_the_private_keys_pem_form(kind, traditional) -> None:
    key = rsa_key() if kind == "rsa" else ec_key()
    signing = mender_signing.signing_public_key(private_pem(key, traditional), KEY)
    verify = mender_signing.verify_public_key(public_pem(key), VERIFY)
    assert signing == verify and signing.kind == ("RSA 2048" if kind == "rsa" else "ECDSA P-256")
    assert mender_signing.pair_problem(signing, verify, KEY, VERIFY) is None


def test_the_fingerprint_is_what_openssl_prints_for_the_verify_key(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    keys = write_pair(tmp_path, ec_key())
    der = subprocess.run(["openssl", "pkey", "-pubin", "-in", str(keys.public), "-outform", "DER"],
                         capture_output=True, check=True).stdout
    assert mender_signing.verify_public_key(keys.public.read_bytes(), keys.public).fingerprint == (
        hashlib.sha256(der).hexdigest())


@pytest.mark.parametrize(("signing", "verify", "kinds"), [
    (lambda: rsa_key(), lambda: rsa_key(3072), " (RSA 2048 and RSA 3072)"),
    (lambda: ec_key(), lambda: ec_key(), ""),
    (lambda: rsa_key(), lambda: ec_key(), " (RSA 2048 and ECDSA P-256)"),
], ids=["rsa-pairs", "ecdsa-pairs", "rsa-private-ecdsa-verify"])
def test_keys_of_two_pairs_are_refused_with_both_fingerprints_and_how_to_derive_the_verify_key(
        signing, verify, kinds) -> None:
    private, public = signing(), verify()
    problem = mender_signing.pair_problem(mender_signing.signing_public_key(private_pem(private), KEY),
                                          mender_signing.verify_public_key(public_pem(public), VERIFY), KEY, VERIFY)
    assert problem is not None
    assert problem.reason.startswith(f"MENDER_ARTIFACT_SIGNING_KEY ({KEY}) and MENDER_ARTIFACT_VERIFY_KEY ({VERIFY}) "
                                     f"are not one pair{kinds}")
    assert "rejects every artifact this build signs" in problem.reason
    assert problem.fix.startswith(f"derive the verify key from the signing key: openssl pkey -in {KEY} -pubout -out "
                                  f"{VERIFY}")


def test_garbage_is_not_a_signing_key() -> None:
    problem = refusal(b"\x00garbage")
    assert "is not a PEM private key" in problem.reason and "openssl genpkey" in problem.fix
    problem = refusal(b"-----BEGIN PRIVATE KEY-----\nnot base64!\n-----END PRIVATE KEY-----\n")
    assert "holds no private key mender-artifact can read" in problem.reason


def test_an_ec_key_with_its_parameters_block_first_is_refused_as_mender_artifact_refuses_it() -> None:
    key = ec_key()
    params = b"-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n"
    problem = refusal(params + private_pem(key, traditional=True))
    assert "starts with an EC PARAMETERS block" in problem.reason
    assert problem.fix.startswith(f"write the key alone: openssl pkey -in {KEY}")
    # the key block alone is fine
    assert mender_signing.signing_public_key(private_pem(key, traditional=True), KEY).kind == "ECDSA P-256"


def test_a_passphrase_protected_key_is_refused() -> None:
    encrypted = ec_key().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.BestAvailableEncryption(b"secret"))
    problem = refusal(encrypted)
    assert "protected by a passphrase" in problem.reason and "openssl pkey -in" in problem.fix


@pytest.mark.parametrize(("make", "kind"), [
    (lambda: ed25519.Ed25519PrivateKey.generate(), "Ed25519"),
    (lambda: ec.generate_private_key(ec.SECP384R1()), "ECDSA secp384r1"),
    (lambda: dsa.generate_private_key(2048), "DSA"),
], ids=["ed25519", "p384", "dsa"])
def test_key_types_mender_artifact_cannot_sign_with_are_refused(make, kind) -> None:
    key = make()
    problem = refusal(private_pem(key))
    assert f"is a key of type {kind}: mender-artifact signs only with RSA or ECDSA P-256" in problem.reason
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert f"is a key of type {kind}" in refusal(public, mender_signing.verify_public_key).reason


def test_a_short_rsa_key_is_refused() -> None:
    assert "is a 1024-bit RSA key, too short" in refusal(private_pem(rsa_key(1024))).reason


def test_a_verify_key_must_be_a_subject_public_key_info_block() -> None:
    key = rsa_key()
    pkcs1 = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.PKCS1)
    assert "is a RSA PUBLIC KEY block" in refusal(pkcs1, mender_signing.verify_public_key).reason
    problem = refusal(private_pem(key), mender_signing.verify_public_key)
    assert "is a private key and would be copied into every image" in problem.reason
    assert problem.fix == f"derive it from the signing key: openssl pkey -in SIGNING_KEY -pubout -out {VERIFY}"
    # a P-256 point in compressed form: OpenSSL reads it, Go's x509 (mender-artifact) does not
    point = ec_key().public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint)
    algorithm = bytes.fromhex("301306072a8648ce3d020106082a8648ce3d030107")  # id-ecPublicKey, prime256v1
    bit_string = bytes([0x03, len(point) + 1, 0]) + point
    der = bytes([0x30, len(algorithm) + len(bit_string)]) + algorithm + bit_string
    pem = b"-----BEGIN PUBLIC KEY-----\n" + base64.encodebytes(der) + b"-----END PUBLIC KEY-----\n"
    assert "is not in the DER form mender-artifact reads" in refusal(pem, mender_signing.verify_public_key).reason
    assert "is a public key; it must be the private key" in refusal(public_pem(key)).reason


@pytest.mark.parametrize("kind", ["rsa", "ecdsa"])
def test_a_signature_verifies_only_over_the_bytes_it_signed_and_only_with_its_key(kind) -> None:
    key, other = (rsa_key(), rsa_key(3072)) if kind == "rsa" else (ec_key(), ec_key())
    manifest = b"96bcd965947569404798bcbdb614f103db5a004eb6e364cfc162c146890ea35b  version\n"
    signature = sign_manifest(key, manifest)
    public = mender_signing.verify_public_key(public_pem(key), VERIFY)
    assert mender_signing.signature_problem(manifest, signature, public) == ""
    assert "does not verify" in mender_signing.signature_problem(manifest + b"\n", signature, public)
    wrong = mender_signing.verify_public_key(public_pem(other), VERIFY)
    assert "does not verify" in mender_signing.signature_problem(manifest, signature, wrong)
    assert mender_signing.signature_problem(manifest, signature + b"\n", public) == "manifest.sig is not base64"


def test_an_ecdsa_signature_in_der_form_verifies_as_the_client_takes_it() -> None:
    """A PKCS#11 signer writes DER; the client (and mender-artifact 4.x) take it beside r || s."""
    key = ec_key()
    manifest = b"x  version\n"
    der = key.sign(manifest, ec.ECDSA(hashes.SHA256()))
    public = mender_signing.verify_public_key(public_pem(key), VERIFY)
    assert mender_signing.signature_problem(manifest, base64.b64encode(der), public) == ""
