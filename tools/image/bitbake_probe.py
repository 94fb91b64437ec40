"""Runs INSIDE the bitbake environment (`kas shell FILE -c "python3 tools/image/bitbake_probe.py ..."`):
resolves an image's runtime closure from bitbake's own parse data through tinfoil and writes
it, with the machine facts the requirement list needs, as JSON.

The host python3 runs it (bitbake's Python), so it uses only the stdlib, bitbake's `bb`
and `tools/image/closure.py`, which it loads by path; no third-party packages."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path


def load_closure_module():
    path = Path(__file__).resolve().with_name("closure.py")
    spec = importlib.util.spec_from_file_location("image_closure", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["image_closure"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def bitbake_lib() -> str:
    bitbake = shutil.which("bitbake")
    if bitbake is None:
        sys.exit("bitbake is not on PATH: run this inside `kas shell` (./task check-image does)")
    return str(Path(bitbake).resolve().parent.parent / "lib")


closure_module = load_closure_module()


class TinfoilSource(closure_module.PackageSource):
    """bitbake's recipe cache, fetched once; per-package RPROVIDES parsed on demand."""

    def __init__(self, tinfoil) -> None:
        self.tinfoil = tinfoil
        cache = tinfoil.cooker.recipecaches[""]
        self.pkg_fn = cache.pkg_fn
        self.rproviders = cache.rproviders
        self.packages = cache.packages
        self.packages_dynamic = cache.packages_dynamic
        self.rundeps = cache.rundeps
        self.runrecs = cache.runrecs
        self.fn_provides = cache.fn_provides
        self.recipe_dynamic: dict = {}
        for pattern, fns in self.packages_dynamic.items():
            for fn in fns:
                self.recipe_dynamic.setdefault(fn, []).append(pattern)
        _latest, preferred, _required = tinfoil.find_providers()
        self.preferred = {pn: entry[1] for pn, entry in preferred.items()}
        self.config = tinfoil.config_data
        self._recipes: dict = {}
        self._rprovides: dict = {}

    def candidates(self, name):
        found = list(self.rproviders.get(name, [])) + list(self.packages.get(name, []))
        if found:
            return found
        import re

        dynamic = []
        for pattern, fns in self.packages_dynamic.items():
            if re.match(pattern.replace("+", r"\+"), name):
                dynamic.extend(fns)
        return dynamic

    def recipe(self, recipe_id):
        if recipe_id not in self._recipes:
            pn = self.pkg_fn[recipe_id]
            # the recipe cache keys runtime depends by package: its keys are PACKAGES
            packages = list(self.rundeps.get(recipe_id, {}))
            self._recipes[recipe_id] = closure_module.Recipe(
                recipe_id=recipe_id,
                pn=pn,
                packages=tuple(packages),
                packages_dynamic=tuple(self.recipe_dynamic.get(recipe_id, ())),
                rdepends={pkg: tuple(deps) for pkg, deps in self.rundeps.get(recipe_id, {}).items()},
                rrecommends={pkg: tuple(recs) for pkg, recs in self.runrecs.get(recipe_id, {}).items()},
                provides=tuple(self.fn_provides.get(recipe_id, ())),
            )
        return self._recipes[recipe_id]

    def rprovides(self, recipe_id):
        if recipe_id not in self._rprovides:
            data = self.tinfoil.parse_recipe_file(recipe_id)
            self._rprovides[recipe_id] = {
                package: tuple((data.getVar("RPROVIDES:" + package) or "").split())
                for package in (data.getVar("PACKAGES") or "").split()
            }
        return self._rprovides[recipe_id]

    def preferred_recipe_id(self, pn):
        return self.preferred.get(pn)

    def setting(self, name):
        return self.config.getVar(name) or ""


def words(data, name: str) -> list:
    import bb.utils

    return bb.utils.explode_deps(data.getVar(name) or "")


def probe(image: str) -> dict:
    sys.path.insert(0, bitbake_lib())
    import bb.tinfoil

    with bb.tinfoil.Tinfoil() as tinfoil:
        print("probe: bitbake parses every recipe (minutes the first time, seconds from its cache)", flush=True)
        tinfoil.prepare(config_only=False, quiet=2)
        print(f"probe: resolving what {image} installs", flush=True)
        image_data = tinfoil.parse_recipe(image)
        group_fn = tinfoil.get_recipe_file("packagegroup-gpu-k8s")
        group = tinfoil.parse_recipe_file(group_fn) if group_fn else None
        source = TinfoilSource(tinfoil)
        closure = closure_module.resolve(
            words(image_data, "PACKAGE_INSTALL"),
            source,
            attempt_only=words(image_data, "PACKAGE_INSTALL_ATTEMPTONLY"),
            bad_recommendations=(image_data.getVar("BAD_RECOMMENDATIONS") or "").split(),
            no_recommendations=(image_data.getVar("NO_RECOMMENDATIONS") or "") == "1",
            package_exclude=(image_data.getVar("PACKAGE_EXCLUDE") or "").split(),
        )
        return {
            "image": image,
            "machine": image_data.getVar("MACHINE"),
            "machineoverrides": (image_data.getVar("MACHINEOVERRIDES") or "").split(":"),
            "target_arch": image_data.getVar("TARGET_ARCH"),
            "cuda_level": group.getVar("GPU_K8S_CUDA") if group else "",
            "cuda_packages": (group.getVar("GPU_K8S_CUDA_PACKAGES") or "").split() if group else [],
            "nvidia": (group.getVar("GPU_K8S_NVIDIA") or "") if group else "",
            "fabricmanager": (group.getVar("GPU_K8S_NVIDIA_FABRICMANAGER") or "") if group else "",
            "package_install": words(image_data, "PACKAGE_INSTALL"),
            "closure": closure.to_json(),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--image", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result = probe(args.image)
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(result, out, indent=1, sort_keys=True)
    os.replace(tmp, args.out)
    print(f"probe: {len(result['closure']['installed'])} packages, written to {args.out}", flush=True)


if __name__ == "__main__":
    main()
