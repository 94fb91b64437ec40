"""Update-signing key pairs made in the test run (no key material is committed), written as
openssl writes them, and manifests signed as mender-artifact signs them (artifact/signer.go:
base64 of RSA PKCS#1 v1.5 over SHA-256, or of ECDSA P-256's r || s, 32 bytes each)."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class KeyFiles:
    private: Path
    public: Path


def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@cache
def rsa_key(bits: int = 2048) -> rsa.RSAPrivateKey:
    """One per size for the run: RSA keys are slow to make."""
    return rsa.generate_private_key(public_exponent=65537, key_size=bits)


@cache
def fleet_key() -> ec.EllipticCurvePrivateKey:
    """The key the fake builds sign with and record as their images' verify key."""
    return ec_key()


def private_pem(key: PrivateKey, traditional: bool = False) -> bytes:
    """PKCS#8 (`openssl genpkey`), or the traditional RSA/EC PRIVATE KEY block (`openssl genrsa
    -traditional`, `openssl ec`)."""
    form = serialization.PrivateFormat.TraditionalOpenSSL if traditional else serialization.PrivateFormat.PKCS8
    return key.private_bytes(serialization.Encoding.PEM, form, serialization.NoEncryption())


def public_pem(key: PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


def write_pair(directory: Path, key: PrivateKey, name: str = "fleet", traditional: bool = False) -> KeyFiles:
    directory.mkdir(parents=True, exist_ok=True)
    files = KeyFiles(directory / f"{name}-private.pem", directory / f"{name}-public.pem")
    files.private.write_bytes(private_pem(key, traditional))
    files.public.write_bytes(public_pem(key))
    return files


def sign_manifest(key: PrivateKey, manifest: bytes) -> bytes:
    """manifest.sig as mender-artifact writes it."""
    if isinstance(key, rsa.RSAPrivateKey):
        raw = key.sign(manifest, padding.PKCS1v15(), hashes.SHA256())
    else:
        r, s = decode_dss_signature(key.sign(manifest, ec.ECDSA(hashes.SHA256())))
        raw = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    return base64.b64encode(raw)
