"""kas files: valid for kas's own schema, every upstream repo pinned, lock files in step."""

import importlib.resources
import json
import re
from pathlib import Path

import pytest
import yaml
from layer_paths import KAS, REPO

kas_includehandler = pytest.importorskip("kas.includehandler", reason="kas is in the tooling venv")
jsonschema_validators = pytest.importorskip("jsonschema.validators")

TOP_FILES = ["jetson-nano.yml", "x86-64.yml", "qemu-x86-64.yml", "x86-64-scarthgap.yml", "jetson-orin-nano.yml",
             "jetson-agx-thor.yml"]
ALL_FILES = sorted(p for p in KAS.rglob("*.yml"))
SERIES_FILES = {"kirkstone", "scarthgap", "wrynose"}  # kas/include/<series>.yml

# Which Yocto series each machine file builds on (issue 16): the Nano stays on kirkstone, the
# only series with its BSP; x86-64 and QEMU are on wrynose; scarthgap proves the layer there.
SERIES_OF = {
    "jetson-nano.yml": "kirkstone",
    "x86-64.yml": "wrynose",
    "qemu-x86-64.yml": "wrynose",
    "x86-64-scarthgap.yml": "scarthgap",
    "jetson-orin-nano.yml": "wrynose",  # issue 17: meta-tegra wrynose, L4T R39.2
    "jetson-agx-thor.yml": "wrynose",  # issue 26: the same BSP pin, tegra264
}

# The canonical upstream URLs (issue 4) and each series' branch of them.
URLS = {
    "bitbake": "https://git.openembedded.org/bitbake",
    "openembedded-core": "https://git.openembedded.org/openembedded-core",
    "meta-yocto": "https://git.yoctoproject.org/meta-yocto",
    "meta-openembedded": "https://git.openembedded.org/meta-openembedded",
    "meta-virtualization": "https://git.yoctoproject.org/meta-virtualization",
    "meta-tegra": "https://github.com/OE4T/meta-tegra.git",
    # issue 9: Mender A/B (docs/layer.md)
    "meta-mender": "https://github.com/mendersoftware/meta-mender.git",
    "meta-mender-community": "https://github.com/mendersoftware/meta-mender-community.git",
}
BITBAKE_BRANCH = {"kirkstone": "2.0", "scarthgap": "2.8", "wrynose": "2.18"}
BSP_BRANCH = {("meta-tegra", "kirkstone"): "kirkstone-l4t-r32.7.x"}


def branch_for(repo: str, series: str) -> str:
    if repo == "bitbake":
        return BITBAKE_BRANCH[series]
    return BSP_BRANCH.get((repo, series), series)


EXPECTED_MACHINE = {
    "jetson-nano.yml": "jetson-nano-devkit",
    "x86-64.yml": "genericx86-64",
    "qemu-x86-64.yml": "qemux86-64",
    "x86-64-scarthgap.yml": "genericx86-64",
    "jetson-orin-nano.yml": "jetson-orin-nano-devkit-nvme",
    "jetson-agx-thor.yml": "jetson-agx-thor-devkit",
}
EXPECTED_TARGET = {
    "jetson-nano.yml": "gpu-k8s-image",
    "x86-64.yml": "gpu-k8s-image",
    "qemu-x86-64.yml": "gpu-k8s-image-dev",
    "x86-64-scarthgap.yml": "gpu-k8s-image",
    "jetson-orin-nano.yml": "gpu-k8s-image",
    "jetson-agx-thor.yml": "gpu-k8s-image",
}


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def merge(dst: dict, src: dict) -> dict:
    for key, val in src.items():
        if isinstance(val, dict) and isinstance(dst.get(key), dict):
            merge(dst[key], val)
        else:
            dst[key] = val
    return dst


def merged(path: Path, with_lock: bool = False) -> dict:
    """The file with its repo-relative includes merged in kas's order (includes first)."""
    conf = load(path)
    out: dict = {}
    for inc in conf.get("header", {}).get("includes", []):
        assert isinstance(inc, str), f"{path.name}: only same-repo includes are expected, got {inc}"
        merge(out, merged(REPO / inc, with_lock))
    merge(out, conf)
    lock = path.with_name(path.stem + ".lock.yml")
    if with_lock and lock.exists():
        merge(out, load(lock))
    return out


def test_kas_files_exist():
    names = {p.name for p in KAS.glob("*.yml")}
    missing = set(TOP_FILES) - names
    assert not missing, f"kas files missing: {sorted(missing)}"


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: str(p.relative_to(KAS)))
def test_kas_file_matches_kas_schema(path):
    schema = json.loads(importlib.resources.files("kas").joinpath("schema-kas.json").read_text())
    validator = jsonschema_validators.validator_for(schema)(schema)
    errors = [
        f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(load(path))
    ]
    assert not errors, f"{path.name} violates kas's schema: {errors}"
    # kas's own loader also checks that header.version is one this kas supports
    kas_includehandler.ConfigFile.load(str(path))


def includes(path: Path) -> list[str]:
    """Every file path includes, directly or through its includes (repo-relative)."""
    found: list[str] = []
    for inc in load(path).get("header", {}).get("includes", []):
        found += [inc, *includes(REPO / inc)]
    return found


@pytest.mark.parametrize("name", TOP_FILES)
def test_every_machine_file_takes_exactly_one_series_and_the_common_settings(name):
    chain = includes(KAS / name)
    series = [Path(inc).stem for inc in chain if Path(inc).stem in SERIES_FILES]
    assert series == [SERIES_OF[name]], f"{name}: includes series files {series}, expected [{SERIES_OF[name]}]"
    assert "kas/include/common.yml" in chain, f"{name}: the settings common to all builds are missing"


def test_common_settings_pin_no_upstream_repo():
    # the repo sets live in the series files only, so one series never inherits another's pins
    for name in ("common.yml", "mender.yml", "mender-qemu.yml", "agent.yml", "server.yml"):
        repos = load(KAS / "include" / name).get("repos", {})
        pinned = sorted(n for n, r in repos.items() if r and ("url" in r or "commit" in r))
        assert not pinned, f"include/{name} pins {pinned}: pins belong in a series file"


@pytest.mark.parametrize("series", sorted(SERIES_FILES))
def test_each_series_file_is_a_complete_core_repo_set_on_its_branches(series):
    repos = load(KAS / "include" / f"{series}.yml")["repos"]
    core = {"bitbake", "openembedded-core", "meta-yocto", "meta-openembedded", "meta-virtualization", "meta-mender"}
    assert set(repos) == core, f"{series}.yml: repos {sorted(repos)} != {sorted(core)}"
    for repo_name, repo in repos.items():
        assert repo["url"] == URLS[repo_name]
        assert str(repo["branch"]) == branch_for(repo_name, series), f"{series}.yml: {repo_name} branch"
    text = (KAS / "include" / f"{series}.yml").read_text()
    commits = re.findall(r"^\s+commit: (\S+)$", text, re.M)
    sources = re.findall(r"^\s+# (\S+), (\d{4}-\d{2}-\d{2}) \(", text, re.M)
    assert len(sources) == len(commits), f"{series}.yml: every pin needs a '# <branch>, <date> (<why>)' line"


@pytest.mark.parametrize("name", TOP_FILES)
def test_every_upstream_repo_is_pinned_to_a_commit_on_its_series_branch(name):
    repos = merged(KAS / name)["repos"]
    for repo_name, repo in repos.items():
        if not repo or "url" not in repo:
            continue  # this repository (the layer itself)
        assert repo_name in URLS, f"{name}: unexpected upstream repo {repo_name}"
        url, branch = URLS[repo_name], branch_for(repo_name, SERIES_OF[name])
        assert repo["url"] == url, f"{name}: {repo_name} url {repo['url']} is not the canonical {url}"
        assert str(repo.get("branch")) == branch, f"{name}: {repo_name} branch should be {branch}"
        assert re.fullmatch(r"[0-9a-f]{40}", str(repo.get("commit", ""))), (
            f"{name}: {repo_name} is not pinned by a 40-hex commit: {repo.get('commit')!r}"
        )


def test_the_layer_declares_every_series_a_kas_file_builds_on():
    conf = (REPO / "meta-gpu-k8s/conf/layer.conf").read_text()
    compat = re.search(r'^LAYERSERIES_COMPAT_gpu-k8s\s*=\s*"([^"]*)"', conf, re.M).group(1).split()
    assert set(SERIES_OF.values()) <= set(compat) == SERIES_FILES


@pytest.mark.parametrize("name", TOP_FILES)
def test_lock_file_pins_the_same_commits(name):
    lock_path = KAS / name.replace(".yml", ".lock.yml")
    assert lock_path.exists(), f"{lock_path.name} missing: run kas lock (docs/layer.md)"
    lock = load(lock_path)["overrides"]["repos"]
    pins = {n: r["commit"] for n, r in merged(KAS / name)["repos"].items() if r and "url" in r}
    locked = {n: r["commit"] for n, r in lock.items()}
    assert locked == pins, f"{lock_path.name} disagrees with the pins in {name}: {locked} != {pins}"


@pytest.mark.parametrize("name", TOP_FILES)
def test_machine_target_and_distro_are_explicit(name):
    conf = merged(KAS / name, with_lock=True)
    assert conf.get("distro") == "poky", f"{name}: distro must be set (kas >= 5.3 defaults to nodistro)"
    assert conf.get("machine") == EXPECTED_MACHINE[name]
    assert conf.get("target") == EXPECTED_TARGET[name]


@pytest.mark.parametrize("name", TOP_FILES)
def test_local_conf_selects_systemd_and_container_features(name):
    conf = merged(KAS / name)
    text = "\n".join(conf.get("local_conf_header", {}).values())
    assert re.search(r'^INIT_MANAGER\s*=\s*"systemd"', text, re.M), f"{name}: INIT_MANAGER systemd"
    features = re.search(r'^DISTRO_FEATURES:append\s*=\s*"([^"]*)"', text, re.M)
    assert features, f"{name}: no DISTRO_FEATURES:append in local_conf_header"
    assert {"virtualization", "seccomp"} <= set(features.group(1).split())


def test_meta_tegra_only_in_the_jetson_builds():
    assert "meta-tegra" in merged(KAS / "jetson-nano.yml")["repos"]
    assert "meta-tegra" in merged(KAS / "jetson-orin-nano.yml")["repos"]
    assert "meta-tegra" in merged(KAS / "jetson-agx-thor.yml")["repos"]
    for name in ("x86-64.yml", "qemu-x86-64.yml", "x86-64-scarthgap.yml"):
        assert "meta-tegra" not in merged(KAS / name)["repos"], f"{name} must build without meta-tegra"


@pytest.mark.parametrize("name", TOP_FILES)
def test_layers_named_in_kas_exist_in_the_layer_dir(name):
    own = merged(KAS / name)["repos"]["meta-gpu-k8s"]["layers"]
    for layer in own:
        assert (REPO / layer / "conf" / "layer.conf").exists(), f"{name}: {layer}/conf/layer.conf missing"


def test_agent_include_selects_the_agent_role():
    text = "\n".join(load(KAS / "include" / "agent.yml")["local_conf_header"].values())
    assert re.search(r'^GPU_K8S_K3S_ROLE\s*=\s*"agent"', text, re.M)


def test_orin_builds_on_meta_tegra_wrynose_with_the_redundant_flash_layout():
    conf = merged(KAS / "jetson-orin-nano.yml", with_lock=True)
    assert conf["repos"]["meta-tegra"]["branch"] == "wrynose"
    # Mender on the Orin: meta-mender-tegra's native scheme (tests/layer/test_orin_layer.py)
    assert conf["repos"]["meta-mender-community"]["branch"] == "wrynose"
    text = "\n".join(conf["local_conf_header"].values())
    # meta-tegra's A/B rootfs slots from the first flash (docs/layer.md, "Jetson Orin")
    assert re.search(r'^USE_REDUNDANT_FLASH_LAYOUT_DEFAULT = "1"$', text, re.M)


@pytest.mark.parametrize(("override", "machine"), [
    ("machine-jetson-agx-orin-devkit.yml", "jetson-agx-orin-devkit"),
    ("machine-jetson-orin-nano-devkit.yml", "jetson-orin-nano-devkit"),
])
def test_orin_machine_overrides_change_the_machine_and_nothing_else(override, machine):
    conf = load(KAS / "include" / override)
    assert conf == {"header": {"version": 14}, "machine": machine}
    assert f"kas build kas/jetson-orin-nano.yml:kas/include/{override}" in (KAS / "include" / override).read_text()


def test_thor_builds_on_the_orins_bsp_pin_with_the_redundant_flash_layout():
    thor, orin = (merged(KAS / name, with_lock=True) for name in ("jetson-agx-thor.yml", "jetson-orin-nano.yml"))
    assert thor["repos"] == orin["repos"], "one wrynose repo set for both R39 SoCs: the same pins, layers and lock"
    text = "\n".join(thor["local_conf_header"].values())
    assert re.search(r'^USE_REDUNDANT_FLASH_LAYOUT_DEFAULT = "1"$', text, re.M)
    assert "kas/include/mender-tegra-native.yml" in includes(KAS / "jetson-agx-thor.yml")


def test_thor_t4000_override_changes_the_machine_and_nothing_else():
    override = "machine-jetson-agx-thor-t4000.yml"
    assert load(KAS / "include" / override) == {"header": {"version": 14}, "machine": "jetson-agx-thor-t4000"}
    assert f"kas build kas/jetson-agx-thor.yml:kas/include/{override}" in (KAS / "include" / override).read_text()
