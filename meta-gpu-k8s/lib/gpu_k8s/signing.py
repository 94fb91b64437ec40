"""Build-time check of the keys that sign update artifacts (pure: paths in, problems out).

Used by classes/gpu_k8s_mender.bbclass before an image's root filesystem and artifact are
made; kept free of bitbake so the tests can call it."""

from __future__ import annotations

from pathlib import Path

MODES = ("required", "optional", "off")
MAKE_KEYS = (
    "make a pair with `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out signing.key "
    "&& openssl pkey -in signing.key -pubout -out verify.pem`, keep signing.key off the repository"
)


def _read_head(path: Path) -> str:
    try:
        with path.open("r", errors="replace") as handle:
            return handle.read(4096)
    except OSError:
        return ""


def signing_problems(mode: str | None, signing_key: str | None, verify_key: str | None) -> list[str]:
    """Why this build may not go on, one sentence each naming the fix; [] when it may."""
    mode = (mode or "").strip()
    if mode not in MODES:
        return [f'GPU_K8S_ARTIFACT_SIGNING must be one of {", ".join(MODES)}, got "{mode}"']
    signing_key = (signing_key or "").strip()
    verify_key = (verify_key or "").strip()
    problems: list[str] = []
    if verify_key:
        head = _read_head(Path(verify_key))
        if not Path(verify_key).is_file():
            problems.append(f"MENDER_ARTIFACT_VERIFY_KEY names {verify_key}, which is not a file")
        elif "PRIVATE KEY" in head:
            problems.append(
                f"MENDER_ARTIFACT_VERIFY_KEY ({verify_key}) is a private key and would be copied into "
                "the image; give its public key (`openssl pkey -in KEY -pubout`)"
            )
        elif "PUBLIC KEY" not in head:
            problems.append(f"MENDER_ARTIFACT_VERIFY_KEY ({verify_key}) is not a PEM public key")
    if signing_key and not Path(signing_key).is_file():
        problems.append(f"MENDER_ARTIFACT_SIGNING_KEY names {signing_key}, which is not a file")
    if mode == "off":
        return problems
    if mode == "required":
        missing = [name for name, value in (("MENDER_ARTIFACT_SIGNING_KEY", signing_key),
                                            ("MENDER_ARTIFACT_VERIFY_KEY", verify_key)) if not value]
        if missing:
            problems.append(
                f"signed update artifacts are required but {' and '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not set: set both in the environment or "
                f"conf/site.conf to key files outside the repository ({MAKE_KEYS}), or set "
                'GPU_K8S_ARTIFACT_SIGNING = "off" for a lab image that accepts unsigned artifacts'
            )
    elif bool(signing_key) != bool(verify_key):
        given, absent = (("MENDER_ARTIFACT_SIGNING_KEY", "MENDER_ARTIFACT_VERIFY_KEY") if signing_key
                         else ("MENDER_ARTIFACT_VERIFY_KEY", "MENDER_ARTIFACT_SIGNING_KEY"))
        problems.append(f"{given} is set but {absent} is not: set both, or neither")
    return problems
