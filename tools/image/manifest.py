"""After a build: does the image's manifest hold what `requirements` (tools/image/requirements.py) asks for?

The manifest (`<image>-<machine>.manifest` in the deploy directory, one `name arch version`
line per installed package) is the truth about a built image. Packages renamed while
packaging (debian.bbclass: a one-library package becomes lib<soname>) are mapped back to
their recipe names through pkgdata's runtime-reverse links, and kernel modules built into
the kernel (modules.builtin in the deploy dir's modules tarball) count as present."""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

from tools.image import requirements as req


def find_manifest(deploy_dir: Path, image: str, machine: str) -> Path | None:
    stable = deploy_dir / f"{image}-{machine}.manifest"
    if stable.is_file():
        return stable
    stamped = sorted(deploy_dir.glob(f"{image}-{machine}*.manifest"), key=lambda p: p.stat().st_mtime)
    return stamped[-1] if stamped else None


def read_manifest(path: Path) -> set[str]:
    return {line.split()[0] for line in path.read_text().splitlines() if line.strip()}


def original_names(installed: set[str], runtime_reverse: Path | None) -> dict[str, str]:
    """Installed name -> name before renaming (itself when not renamed or unknown)."""
    names = {}
    for name in installed:
        link = runtime_reverse / name if runtime_reverse else None
        names[name] = Path(str(link.readlink())).name if link and link.is_symlink() else name
    return names


def builtin_modules(deploy_dir: Path, machine: str) -> set[str]:
    """Module names the kernel has built in, from modules-<machine>.tgz (empty if absent)."""
    tarball = deploy_dir / f"modules-{machine}.tgz"
    if not tarball.is_file():
        return set()
    modules = set()
    with tarfile.open(tarball) as archive:
        for member in archive.getmembers():
            if member.name.endswith("/modules.builtin") and member.isfile():
                content = archive.extractfile(member)
                for line in content.read().decode(errors="replace").splitlines() if content else ():
                    if line.strip():
                        modules.add(Path(line.strip()).name.removesuffix(".ko").replace("-", "_"))
    return modules


def cuda_packages_from_pkgdata(runtime_dir: Path | None) -> list[str]:
    """The CUDA packages packagegroup-gpu-k8s really depended on (pkgdata keeps its final
    RDEPENDS); the default level's when pkgdata is not there."""
    every = [package for _, packages in req.CUDA_LEVELS for package in packages]
    group = runtime_dir / "packagegroup-gpu-k8s" if runtime_dir else None
    if group and group.is_file():
        for line in group.read_text().splitlines():
            if line.startswith("RDEPENDS:packagegroup-gpu-k8s:"):
                words = set(re.sub(r"\([^)]*\)", " ", line.split(":", 2)[2]).split())
                return [package for package in every if package in words]
    return req.cuda_packages(req.DEFAULT_CUDA_LEVEL)


def nvidia_from_pkgdata(runtime_dir: Path | None, default: bool) -> bool:
    """Whether packagegroup-gpu-k8s carried the NVIDIA stack (GPU_K8S_NVIDIA) in this build,
    from its final RDEPENDS in pkgdata; `default` when pkgdata is not there."""
    group = runtime_dir / "packagegroup-gpu-k8s" if runtime_dir else None
    if group and group.is_file():
        for line in group.read_text().splitlines():
            if line.startswith("RDEPENDS:packagegroup-gpu-k8s:"):
                return "gpu-k8s-nvidia-cdi" in re.sub(r"\([^)]*\)", " ", line.split(":", 2)[2]).split()
    return default


def check_manifest(
    deploy_dir: Path,
    image: str,
    machine: str,
    classes: list[str],
    cuda_packages: list[str],
    runtime_reverse: Path | None = None,
    role: str | None = None,
) -> tuple[Path, list[req.Finding]]:
    """Raises FileNotFoundError when the build left no manifest."""
    manifest = find_manifest(deploy_dir, image, machine)
    if manifest is None:
        raise FileNotFoundError(f"no {image}-{machine}*.manifest in {deploy_dir}")
    installed = read_manifest(manifest)
    originals = original_names(installed, runtime_reverse)
    by_original = {original: name for name, original in originals.items()}

    def has(name: str) -> tuple[str, str] | None:
        if name in installed:
            return name, ""
        if name in by_original:
            return by_original[name], f"{name} renamed while packaging"
        return None

    requirements = req.requirements_for(classes, cuda_packages, role=role)
    return manifest, req.evaluate(requirements, has, builtin_modules(deploy_dir, machine))
