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
import shlex
import shutil
import subprocess
import sys
import tempfile
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


def recipe_data(tinfoil, pn: str):
    """The parsed recipe bitbake builds for pn, or None when nothing provides it."""
    try:
        fn = tinfoil.get_recipe_file(pn)
    except Exception:  # bb.providers.NoProvider, or a recipe skipped for this machine
        return None
    return tinfoil.parse_recipe_file(fn) if fn else None


def recipe_file(data, name: str) -> tuple:
    """(path, text) of a file a recipe fetches as file://NAME, found as the fetcher finds it
    (FILESPATH: machine and override directories first); (None, None) when there is none."""
    import bb.utils

    path = bb.utils.which(data.getVar("FILESPATH") or "", name)
    if not path or not os.path.isfile(path):
        return None, None
    with open(path, encoding="utf-8") as handle:
        return path, handle.read()


def layer_relative(data, path: str) -> str:
    """A file of a recipe named from its recipe's directory (files/tegra234/daemon.json)."""
    return os.path.relpath(path, os.path.dirname(data.getVar("FILE")))


def installs(closure, name: str):
    """The closure's entry for a runtime name, or None."""
    return closure.package_for(name)


def k3s_facts(tinfoil) -> dict:
    """The k3s configuration drop-ins the image installs, rendered exactly as do_install
    renders them (the recipe's own script and GPU_K8S_K3S_CONFIG_ARGS), and the units."""
    facts = {"dropins": {}, "units": {}}
    config = recipe_data(tinfoil, "gpu-k8s-k3s-config")
    if config is not None:
        script, _ = recipe_file(config, "gpu-k8s-k3s-config.py")
        if script is None:
            raise SystemExit("gpu-k8s-k3s-config has no gpu-k8s-k3s-config.py on its FILESPATH")
        with tempfile.TemporaryDirectory() as out:
            args = shlex.split(config.getVar("GPU_K8S_K3S_CONFIG_ARGS") or "")
            subprocess.run([sys.executable, script, "--output-dir", out, *args], check=True)
            for name in sorted(os.listdir(out)):
                with open(os.path.join(out, name), encoding="utf-8") as handle:
                    facts["dropins"][name] = handle.read()
    k3s = recipe_data(tinfoil, "k3s")
    if k3s is not None:
        for unit in ("k3s.service", "k3s-agent.service"):
            _, text = recipe_file(k3s, unit)
            if text is not None:
                facts["units"][unit] = text
    return facts


def state_facts(tinfoil, image_data, closure) -> dict:
    """What tools/image/state_paths.py needs to tell where the image's writable state lives
    and whether it is kept on /data across a slot switch."""
    notes = []
    facts = {"ab": "gpu-k8s-mender" in (image_data.getVar("DISTRO_FEATURES") or "").split(),
             "mender_features": (image_data.getVar("MENDER_FEATURES") or "").split(), "notes": notes}
    data = recipe_data(tinfoil, "gpu-k8s-data")
    if data is not None and installs(closure, "gpu-k8s-data"):
        for key, name in (("persist_list", "persist.list"), ("node_config_list", "node-config.list")):
            facts[key] = recipe_file(data, name)[1] or ""
    docker = installs(closure, "docker")
    if docker:
        docker_recipe = recipe_data(tinfoil, docker.pn)
        facts["docker"] = {"version": (docker_recipe.getVar("DOCKER_VERSION") or docker_recipe.getVar("PV") or "")
                           if docker_recipe is not None else ""}
        config = recipe_data(tinfoil, "gpu-k8s-docker-config")
        if config is not None and installs(closure, "gpu-k8s-docker-config"):
            name = config.getVar("GPU_K8S_DOCKER_DAEMON_JSON") or "daemon.json"
            path, text = recipe_file(config, name)
            facts["docker"]["daemon_json"] = text or ""
            facts["docker"]["daemon_json_source"] = ("/etc/docker/daemon.json from gpu-k8s-docker-config's "
                                                     + layer_relative(config, path) if path else "no daemon.json")
        else:
            facts["docker"]["daemon_json_source"] = "no daemon.json (gpu-k8s-docker-config is not installed)"
    containerd = installs(closure, "virtual-containerd") or installs(closure, "containerd")
    if containerd:
        recipe = recipe_data(tinfoil, containerd.pn)
        uris = (recipe.getVar("SRC_URI") or "").split() if recipe is not None else []
        # a config.toml among its files is what it installs as /etc/containerd/config.toml
        named = [uri.split(";")[0][len("file://"):] for uri in uris if uri.startswith("file://")
                 and os.path.basename(uri.split(";")[0]) == "config.toml"]
        path, text = recipe_file(recipe, named[0]) if named else (None, None)
        facts["containerd"] = {"config_toml": text, "source": f"{containerd.pn}'s config.toml" if path else ""}
    if installs(closure, "k3s"):
        facts["k3s"] = k3s_facts(tinfoil)
    if installs(closure, "openssh-sshd"):
        openssh = recipe_data(tinfoil, "openssh")
        facts["sshd"] = {"packageconfig": (openssh.getVar("PACKAGECONFIG") or "").split(),
                         "host_key_dir": openssh.getVar("OPENSSH_HOST_KEY_DIR")} if openssh is not None else {}
        if "read-only-rootfs" in (image_data.getVar("IMAGE_FEATURES") or "").split():
            notes.append("read-only-rootfs: sshd takes its keys from OPENSSH_HOST_KEY_DIR_READONLY_CONFIG, in /run")
    facts["dropbear"] = bool(installs(closure, "dropbear"))
    systemd = recipe_data(tinfoil, "systemd")
    facts["networkd"] = bool(installs(closure, "systemd")) and systemd is not None and \
        "networkd" in (systemd.getVar("PACKAGECONFIG") or "").split()
    facts["networkmanager"] = bool(installs(closure, "networkmanager"))
    facts["settings"] = settings_read(tinfoil, image_data, closure)
    return facts


# The values the facts above come from, as bitbake expanded them: recipe (None: the image) and
# variable. Kept in the JSON for the record (docs quote them from a real parse).
SETTINGS = (
    (None, "MENDER_FEATURES"), (None, "MENDER_DATA_PART"), (None, "MENDER_DATA_PART_FSTYPE_TO_GEN"),
    (None, "MENDER_DATA_PART_LABEL"), (None, "GPU_K8S_DATA_PARTNAME"), (None, "ROOTFS_POSTPROCESS_COMMAND"),
    ("gpu-k8s-docker-config", "GPU_K8S_DOCKER_DAEMON_JSON"), ("gpu-k8s-k3s-config", "GPU_K8S_K3S_CONFIG_ARGS"),
    ("openssh", "PACKAGECONFIG"), ("openssh", "OPENSSH_HOST_KEY_DIR"), ("systemd", "PACKAGECONFIG"),
)


def settings_read(tinfoil, image_data, closure) -> dict:
    values = {}
    docker = installs(closure, "docker")
    wanted = list(SETTINGS) + ([(docker.pn, "PV")] if docker else [])
    for pn, var in wanted:
        data = image_data if pn is None else recipe_data(tinfoil, pn)
        values[f"{pn or image_data.getVar('PN')}:{var}"] = data.getVar(var) if data is not None else None
    return values


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
            "state": state_facts(tinfoil, image_data, closure),
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
