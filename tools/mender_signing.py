"""The update-signing keys and artifact signatures, read the way the tools that use them do.

mender-artifact (4.0.0 on kirkstone, 4.4.1 on scarthgap and wrynose: meta-mender's recipes at
our pins) signs each artifact with MENDER_ARTIFACT_SIGNING_KEY; the Mender client on the board
(5.x) checks it with the verify key the image carries (/etc/mender/artifact-verify-key.pem).
From their source (mender-artifact artifact/signer.go, areader/reader.go; mender
src/common/crypto/platform/openssl/crypto.cpp, src/artifact/v3/manifest/manifest.cpp):

- the private key is the *first* PEM block of the file, unencrypted, PKCS#1 RSA, SEC1 EC or
  PKCS#8 (RSA or EC); other key types are refused, and ECDSA signs on P-256 only;
- the verify key is a PEM SubjectPublicKeyInfo ("PUBLIC KEY") block, RSA or ECDSA;
- `manifest.sig` is the base64 (standard alphabet, padded) of a signature over the SHA-256
  of the `manifest` member's bytes: RSA PKCS#1 v1.5, or ECDSA as r || s, 32 bytes each,
  big-endian (the client also takes a DER signature, as a PKCS#11 signer writes one).

Pure: bytes in, keys and verdicts out; reading the files is the callers' one I/O."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

SIGNING_VARIABLE = "MENDER_ARTIFACT_SIGNING_KEY"
VERIFY_VARIABLE = "MENDER_ARTIFACT_VERIFY_KEY"
# Our floor, not mender-artifact's (it signs with shorter keys): a fleet's key cannot be changed
# without a signed update or a reflash of every board, and NIST SP 800-131A ended RSA < 2048.
MIN_RSA_BITS = 2048
ECDSA_COMPONENT_BYTES = 32  # P-256: r and s, 32 bytes each in mender-artifact's r || s form
FINGERPRINT_NAME = "SHA-256 of the public key's DER SubjectPublicKeyInfo"
MAKE_PAIR = ("make a new pair: openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out signing.key "
             "&& openssl pkey -in signing.key -pubout -out verify.pem (docs/fleet.md, \"First flash\")")

_PEM_BLOCK = re.compile(
    rb"-----BEGIN (?P<label>[^\r\n-]+)-----\r?\n(?P<body>.*?)-----END (?P=label)-----", re.S)


class KeyProblem(Exception):
    """A key mender-artifact or the Mender client cannot use: why, and what to do."""

    def __init__(self, reason: str, fix: str) -> None:
        super().__init__(f"{reason}; fix: {fix}")
        self.reason = reason
        self.fix = fix


@dataclass(frozen=True)
class PublicKey:
    """A public key as the tools compare it: its kind and its DER SubjectPublicKeyInfo."""

    kind: str  # "RSA 3072" or "ECDSA P-256"
    spki_der: bytes

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the DER SubjectPublicKeyInfo, in hex: the same for both halves of a pair,
        and what `openssl pkey -pubin -in verify.pem -outform DER | sha256sum` prints."""
        return hashlib.sha256(self.spki_der).hexdigest()

    def loaded(self) -> rsa.RSAPublicKey | ec.EllipticCurvePublicKey:
        key = serialization.load_der_public_key(self.spki_der)
        assert isinstance(key, (rsa.RSAPublicKey, ec.EllipticCurvePublicKey))
        return key


@dataclass(frozen=True)
class PemBlock:
    label: str
    headers: dict[str, str]
    der: bytes | None  # None when the body is not base64


def first_pem_block(data: bytes) -> PemBlock | None:
    """The first PEM block of a file, as Go's pem.Decode (mender-artifact) takes it."""
    match = _PEM_BLOCK.search(data)
    if match is None:
        return None
    label = match["label"].decode("ascii", "replace")
    lines = match["body"].decode("ascii", "replace").splitlines()
    headers: dict[str, str] = {}
    while lines and ":" in lines[0]:
        name, _, value = lines.pop(0).partition(":")
        headers[name.strip()] = value.strip()
    try:
        der = base64.b64decode("".join(line.strip() for line in lines), validate=True)
    except (binascii.Error, ValueError):
        der = None
    return PemBlock(label, headers, der)


def _kind(key: object) -> str:
    if isinstance(key, (rsa.RSAPrivateKey, rsa.RSAPublicKey)):
        return f"RSA {key.key_size}"
    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)):
        return "ECDSA P-256" if isinstance(key.curve, ec.SECP256R1) else f"ECDSA {key.curve.name}"
    return type(key).__name__.removeprefix("_").replace("PrivateKey", "").replace("PublicKey", "") or "unknown"


def _usable_kind(key: object, variable: str, path: Path) -> str:
    """The key's kind when mender-artifact and the client can use it; raises KeyProblem."""
    kind = _kind(key)
    if isinstance(key, (rsa.RSAPrivateKey, rsa.RSAPublicKey)):
        if key.key_size < MIN_RSA_BITS:
            raise KeyProblem(f"{variable} ({path}) is a {key.key_size}-bit RSA key, too short to sign a fleet's OS "
                             f"(at least {MIN_RSA_BITS} bits)", MAKE_PAIR)
        return kind
    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)) and kind == "ECDSA P-256":
        return kind
    raise KeyProblem(f"{variable} ({path}) is a key of type {kind}: mender-artifact signs only with RSA or ECDSA P-256 "
                     "keys (artifact/signer.go), and the Mender client checks only those", MAKE_PAIR)


def _spki(key: rsa.RSAPublicKey | ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def signing_public_key(data: bytes, path: Path, variable: str = SIGNING_VARIABLE) -> PublicKey:
    """The public half of the private key mender-artifact would sign with; raises KeyProblem."""
    block = first_pem_block(data)
    if block is None:
        raise KeyProblem(f"{variable} ({path}) is not a PEM private key (no -----BEGIN ...----- block; "
                         "mender-artifact reads PEM only)", MAKE_PAIR)
    if block.label == "EC PARAMETERS":
        raise KeyProblem(f"{variable} ({path}) starts with an EC PARAMETERS block (as `openssl ecparam -genkey` "
                         "writes it), and mender-artifact reads only a file's first block",
                         f"write the key alone: openssl pkey -in {path} -out {path}.new && mv {path}.new {path}")
    if "ENCRYPTED" in block.label or "ENCRYPTED" in block.headers.get("Proc-Type", ""):
        raise KeyProblem(f"{variable} ({path}) is protected by a passphrase, and mender-artifact reads only "
                         "unencrypted keys",
                         f"write an unencrypted copy, kept as safe as the original: openssl pkey -in {path} -out "
                         "signing.key, and point the variable at it")
    if "PUBLIC KEY" in block.label:
        raise KeyProblem(f"{variable} ({path}) is a public key; it must be the private key that signs",
                         f"point {variable} at the private key and {VERIFY_VARIABLE} at this file")
    try:
        if block.der is None:
            raise ValueError("its body is not base64")
        key = serialization.load_der_private_key(block.der, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as error:
        raise KeyProblem(f"{variable} ({path}) holds no private key mender-artifact can read (its first block, "
                         f"{block.label}: {error})", MAKE_PAIR) from None
    kind = _usable_kind(key, variable, path)
    public = key.public_key()
    assert isinstance(public, (rsa.RSAPublicKey, ec.EllipticCurvePublicKey))
    return PublicKey(kind, _spki(public))


def verify_public_key(data: bytes, path: Path, variable: str = VERIFY_VARIABLE) -> PublicKey:
    """The verify key as the Mender client reads it (PEM SubjectPublicKeyInfo); raises KeyProblem."""
    derive = f"derive it from the signing key: openssl pkey -in SIGNING_KEY -pubout -out {path}"
    block = first_pem_block(data)
    if block is None:
        raise KeyProblem(f"{variable} ({path}) is not a PEM public key (no -----BEGIN PUBLIC KEY----- block)", derive)
    if "PRIVATE KEY" in block.label:
        raise KeyProblem(f"{variable} ({path}) is a private key and would be copied into every image", derive)
    if block.label != "PUBLIC KEY":
        raise KeyProblem(f"{variable} ({path}) is a {block.label} block; the Mender client reads only a "
                         "SubjectPublicKeyInfo (-----BEGIN PUBLIC KEY-----) block", derive)
    try:
        if block.der is None:
            raise ValueError("its body is not base64")
        key = serialization.load_der_public_key(block.der)
    except (ValueError, UnsupportedAlgorithm) as error:
        raise KeyProblem(f"{variable} ({path}) holds no public key the Mender client can read ({error})",
                         derive) from None
    kind = _usable_kind(key, variable, path)
    assert isinstance(key, (rsa.RSAPublicKey, ec.EllipticCurvePublicKey))
    if _spki(key) != block.der:
        # Go's x509.ParsePKIXPublicKey takes DER with an uncompressed EC point only.
        raise KeyProblem(f"{variable} ({path}) is not in the DER form mender-artifact reads (a compressed EC "
                         "point, or BER)", derive)
    return PublicKey(kind, block.der)


def pair_problem(signing: PublicKey, verify: PublicKey, signing_path: Path, verify_path: Path) -> KeyProblem | None:
    """None when the verify key is the signing key's public half; else why, and the fix."""
    if signing.spki_der == verify.spki_der:
        return None
    kinds = f" ({signing.kind} and {verify.kind})" if signing.kind != verify.kind else ""
    return KeyProblem(
        f"{SIGNING_VARIABLE} ({signing_path}) and {VERIFY_VARIABLE} ({verify_path}) are not one pair{kinds}: public "
        f"key fingerprints {signing.fingerprint[:16]}... and {verify.fingerprint[:16]}... ({FINGERPRINT_NAME}); "
        "every board would carry a key that rejects every artifact this build signs",
        f"derive the verify key from the signing key: openssl pkey -in {signing_path} -pubout -out {verify_path} "
        f"(if boards already carry {verify_path}, sign with its private key instead)",
    )


def signature_problem(manifest: bytes, signature: bytes, key: PublicKey) -> str:
    """'' when the Mender client holding `key` would accept `signature` over `manifest`;
    otherwise why not, in a few words."""
    try:
        decoded = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return "manifest.sig is not base64"
    public = key.loaded()
    try:
        if isinstance(public, rsa.RSAPublicKey):
            public.verify(decoded, manifest, padding.PKCS1v15(), hashes.SHA256())
        else:
            if len(decoded) == 2 * ECDSA_COMPONENT_BYTES:  # mender-artifact's r || s
                r = int.from_bytes(decoded[:ECDSA_COMPONENT_BYTES], "big")
                s = int.from_bytes(decoded[ECDSA_COMPONENT_BYTES:], "big")
                decoded = encode_dss_signature(r, s)
            public.verify(decoded, manifest, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return "its signature does not verify"
    except ValueError as error:  # a DER signature that does not parse, say
        return f"its signature is malformed for a {key.kind} key ({error})"
    return ""
