"""Python interpreters and the virtual environments the test legs run in."""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tools import console


class MissingInterpreter(Exception):
    pass


def interpreter_version(executable: str) -> tuple[int, int] | None:
    """(major, minor) of a Python that actually runs; pyenv shims that are on PATH but not
    selected fail here, which is why we ask the interpreter instead of trusting its name."""
    try:
        completed = subprocess.run(
            [executable, "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True, text=True, timeout=30, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = completed.stdout.split()
    if completed.returncode != 0 or len(parts) != 2:
        return None
    return int(parts[0]), int(parts[1])


def interpreter_candidates(version: str) -> list[str]:
    """Where a Python X.Y may live: PATH, pyenv, the deadsnakes/distro locations."""
    candidates = []
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(on_path)
    pyenv_root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    for root in dict.fromkeys([pyenv_root, "/root/.pyenv"]):
        candidates.extend(sorted(glob.glob(f"{root}/versions/{version}*/bin/python"), reverse=True))
    candidates.extend([f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"])
    return list(dict.fromkeys(candidates))


def find_interpreter(version: str) -> str:
    wanted = tuple(int(part) for part in version.split("."))
    for candidate in interpreter_candidates(version):
        if interpreter_version(candidate) == wanted:
            return candidate
    raise MissingInterpreter(
        f"Python {version} not found (looked for python{version} on PATH and in pyenv); install it: "
        f"`pyenv install {version}` or `sudo apt-get install python{version} python{version}-venv` "
        "(deadsnakes PPA on Ubuntu)"
    )


@dataclass(frozen=True)
class VenvSpec:
    """A venv made from one interpreter version and pip requirements."""

    path: Path
    python_version: str
    requirement_files: Sequence[Path]
    packages: Sequence[str] = ()

    def fingerprint(self) -> str:
        digest = hashlib.sha256(self.python_version.encode())
        for requirement_file in self.requirement_files:
            digest.update(requirement_file.read_bytes())
        for package in self.packages:
            digest.update(package.encode())
        return digest.hexdigest()

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def stamp(self) -> Path:
        return self.path / ".installed-fingerprint"


def is_current(spec: VenvSpec) -> bool:
    try:
        return spec.python.exists() and spec.stamp.read_text().strip() == spec.fingerprint()
    except OSError:
        return False


def ensure_venv(spec: VenvSpec) -> Path:
    """Create or refresh the venv when missing or its inputs changed; returns its python."""
    if is_current(spec):
        return spec.python
    interpreter = find_interpreter(spec.python_version)
    if interpreter_version(str(spec.python)) != tuple(int(p) for p in spec.python_version.split(".")):
        console.info(f"creating {spec.path} with {interpreter}")
        shutil.rmtree(spec.path, ignore_errors=True)
        subprocess.run([interpreter, "-m", "venv", str(spec.path)], check=True)
    else:
        console.info(f"updating {spec.path}: its requirements changed")
    install = [str(spec.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    for requirement_file in spec.requirement_files:
        install += ["-r", str(requirement_file)]
    subprocess.run([*install, *spec.packages], check=True)
    spec.stamp.write_text(spec.fingerprint() + "\n")
    return spec.python
