"""Issue 16: one layer for kirkstone, scarthgap and wrynose, every difference in one place."""

import re
import sys

import pytest
from layer_paths import LAYER

SERIES = ("kirkstone", "scarthgap", "wrynose")
SERIES_DIR = LAYER / "conf/series"
SERIES_CLASS = LAYER / "classes/gpu_k8s_series.bbclass"
RECIPE_SUFFIXES = (".bb", ".bbappend", ".bbclass", ".inc")


def series_text(series: str) -> str:
    return (SERIES_DIR / f"{series}.inc").read_text()


def code_lines(text: str) -> list[str]:
    lines = text.replace("\\\n", " ").splitlines()
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def masks(series: str) -> list[str]:
    """BBMASK entries of one series file, with the layer directory substituted."""
    found = re.findall(r'^BBMASK \+= "([^"]*)"$', series_text(series), re.M)
    return [entry.replace("${GPU_K8S_LAYERDIR}", str(LAYER)) for entry in found]


def masked(series: str, path) -> bool:
    return any(re.search(entry, str(path)) for entry in masks(series))


def layer_conf() -> str:
    return (LAYER / "conf/layer.conf").read_text()


def test_layer_conf_reads_the_series_file_through_a_global_class():
    conf = layer_conf()
    compat = re.search(r'^LAYERSERIES_COMPAT_gpu-k8s = "([^"]*)"$', conf, re.M).group(1).split()
    assert tuple(compat) == SERIES
    assert re.search(r'^INHERIT \+= "gpu_k8s_series"$', conf, re.M)
    assert re.search(r'^GPU_K8S_LAYERDIR = "\$\{LAYERDIR\}"$', conf, re.M)
    # the class runs after every layer.conf, when oe-core has named its series; besides that
    # require it only holds gpu_k8s_lib (below), which every recipe and class can then call
    lines = code_lines(SERIES_CLASS.read_text())
    assert lines[0] == "require ${GPU_K8S_LAYERDIR}/conf/series/${LAYERSERIES_CORENAMES}.inc"
    assert lines[1] == "def gpu_k8s_lib(d, module):"
    assert all(line.startswith("    ") for line in lines[2:])


class FakeData:
    """The one datastore call gpu_k8s_lib makes."""

    def getVar(self, name: str) -> str:  # bitbake's name
        assert name == "GPU_K8S_LAYERDIR"
        return str(LAYER)


def test_gpu_k8s_lib_imports_from_the_layer_lib_on_any_series(monkeypatch):
    # wrynose's base.bbclass does not put layers' lib/ on sys.path: the class's def must
    text = SERIES_CLASS.read_text()
    source = text[text.index("def gpu_k8s_lib(d, module):"):]
    namespace: dict = {}
    exec(compile(source, str(SERIES_CLASS), "exec"), namespace)
    lib = str(LAYER / "lib")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != lib])
    for name in [m for m in sys.modules if m == "gpu_k8s" or m.startswith("gpu_k8s.")]:
        monkeypatch.delitem(sys.modules, name)
    module = namespace["gpu_k8s_lib"](FakeData(), "gpu_k8s.k3s_line")
    assert module.__name__ == "gpu_k8s.k3s_line"
    assert module.__file__ == str(LAYER / "lib/gpu_k8s/k3s_line.py")
    assert namespace["gpu_k8s_lib"](FakeData(), "gpu_k8s.signing").signing_problems("off", "", "") == []
    assert sys.path.count(lib) == 1, "added once, not on every call"


def test_parse_time_python_reaches_lib_only_through_gpu_k8s_lib():
    # one place puts lib/ on sys.path; recipes and classes call it rather than copying it
    copies = [
        str(path.relative_to(LAYER))
        for path in LAYER.rglob("*")
        if path.suffix in RECIPE_SUFFIXES and path != SERIES_CLASS and "sys.path" in path.read_text()
    ]
    assert not copies, f"lib/ put on sys.path outside classes/gpu_k8s_series.bbclass: {copies}"
    users = sorted(
        str(path.relative_to(LAYER))
        for path in LAYER.rglob("*")
        if path.suffix in RECIPE_SUFFIXES and "gpu_k8s_lib(d, 'gpu_k8s." in path.read_text()
    )
    assert users == [
        "classes/gpu_k8s_mender.bbclass",
        "classes/gpu_k8s_mender_tegra_layout.bbclass",
        "recipes-containers/k3s/k3s-release.inc",
        "recipes-containers/k3s/k3s_version.inc",
    ]


def test_there_is_one_series_file_per_declared_series_and_no_other():
    assert sorted(p.stem for p in SERIES_DIR.glob("*.inc")) == sorted(SERIES)


def test_no_recipe_or_class_branches_on_the_series():
    # the series files are the only place a series name or LAYERSERIES_CORENAMES may be acted on
    offenders = []
    for path in LAYER.rglob("*"):
        if path.suffix not in RECIPE_SUFFIXES or path.parent == SERIES_DIR:
            continue
        for line in code_lines(path.read_text()):
            inline_test = re.search(r"\$\{@[^}]*\b(kirkstone|scarthgap|wrynose)\b", line)
            names_series = "LAYERSERIES_CORENAMES" in line or inline_test
            if names_series and path != SERIES_CLASS:
                offenders.append(f"{path.relative_to(LAYER)}: {line.strip()}")
    assert not offenders, "series conditionals outside conf/series/:\n" + "\n".join(offenders)


@pytest.mark.parametrize("path", sorted(p for p in LAYER.rglob("*.bb")), ids=lambda p: p.name)
def test_recipes_take_their_files_from_unpackdir_not_workdir(path):
    # wrynose stops at parse with "Using S = ${WORKDIR} is no longer supported", and unpacks
    # file:// sources into UNPACKDIR (WORKDIR/sources), not WORKDIR
    text = path.read_text()
    assert not re.search(r'^S = "\$\{WORKDIR\}"', text, re.M), f"{path.name}: S = ${{WORKDIR}}"
    assert "${WORKDIR}/" not in text, f"{path.name}: reads a fetched file from ${{WORKDIR}}, use ${{UNPACKDIR}}"


def test_unpackdir_defaults_to_workdir_only_where_oe_core_lacks_it():
    # oe-core gained UNPACKDIR in 5.1 and from then on rejects UNPACKDIR = WORKDIR
    rule = 'UNPACKDIR ??= "${WORKDIR}"'
    assert rule in code_lines(series_text("kirkstone"))
    assert rule in code_lines(series_text("scarthgap"))
    assert not any("UNPACKDIR" in line for line in code_lines(series_text("wrynose")))


# Masks of other layers' files, each with why (the file is not in this repository, so the
# "matches a file" check cannot see it): meta-mender-tegra-common's Go-client append, dangling
# on wrynose, where a bbappend without its recipe stops the parse.
UPSTREAM_MASKS = {("wrynose", "/meta-mender-tegra-common/recipes-mender/mender-client/mender-client_"),
                  ("kirkstone", r"/meta-tegra/recipes-bsp/tools/tegra-boot-tools_git\.bb$")}


@pytest.mark.parametrize("series", SERIES)
def test_every_mask_matches_a_file_of_the_layer(series):
    # a mask that matches nothing has rotted (a renamed recipe would then parse where it must not)
    files = [p for p in LAYER.rglob("*") if p.is_file()]
    for entry in masks(series):
        if (series, entry) in UPSTREAM_MASKS:
            continue
        assert entry.startswith(str(LAYER) + "/"), f"{series}.inc: mask {entry} is not under the layer"
        assert any(re.search(entry, str(p)) for p in files), f"{series}.inc: mask {entry} matches nothing"


def test_upstream_masks_name_no_file_of_this_layer():
    # a mask meant for another layer's file must not hide one of ours by accident
    files = [p for p in LAYER.rglob("*") if p.is_file()]
    for series, entry in UPSTREAM_MASKS:
        assert entry in masks(series)
        assert not any(re.search(entry, str(p)) for p in files), entry


def test_the_nano_series_masks_only_meta_tegras_development_tegra_boot_tools():
    # meta-tegra kirkstone-l4t-r32.7.x (94e3db31): tegra-boot-tools_git.bb has SRCREV = AUTOREV,
    # which needs the network while parsing; the release recipe beside it is the one built
    tools = "/build/meta-tegra/recipes-bsp/tools"
    assert masked("kirkstone", f"{tools}/tegra-boot-tools_git.bb")
    assert not masked("kirkstone", f"{tools}/tegra-boot-tools_3.1.2.bb")
    assert not masked("kirkstone", f"{tools}/tegra-boot-tools.inc")


def test_the_masks_leave_the_recipes_every_series_needs():
    for series in SERIES:
        for recipe in LAYER.glob("recipes-*/*/*.bb"):
            assert not masked(series, recipe), f"{series}.inc masks {recipe.relative_to(LAYER)}"


def test_security_policy_says_how_to_report_and_covers_every_series():
    # wrynose's yocto-check-layer fails a layer without SECURITY.md (test_security)
    policy = (LAYER / "SECURITY.md").read_text()
    assert re.search(r"^## Reporting a vulnerability", policy, re.M)
    assert re.search(r"<[\w.+-]+@[\w-]+(\.[\w-]+)+>", policy), "an address to report to"
    for series in SERIES:
        assert series in policy, f"SECURITY.md does not say whether {series} builds get fixes"


def series_assignment(series: str, var: str) -> str:
    found = re.findall(rf'^{var} = "([^"]*)"$', series_text(series), re.M)
    assert len(found) == 1, f"{series}.inc: {var} must be set once, found {found}"
    return found[0]


@pytest.mark.parametrize("series", SERIES)
def test_every_series_says_which_extra_kernel_fragment_it_needs(series):
    # linux-yocto 6.17+ (wrynose's 6.18) drops iptable_filter/iptable_nat without
    # NETFILTER_XTABLES_LEGACY; 5.15 and 6.6 have no such symbol, so they must not ask for it
    value = series_assignment(series, "GPU_K8S_LINUX_YOCTO_SERIES_CFG")
    fragments = [uri.removeprefix("file://") for uri in value.split()]
    assert all(uri.startswith("file://") for uri in value.split())
    kernel_dir = LAYER / "recipes-kernel/linux/linux-yocto"
    for fragment in fragments:
        assert (kernel_dir / fragment).exists(), f"{series}.inc names a missing fragment {fragment}"
    legacy = "gpu-k8s-k3s-xtables-legacy.cfg"
    assert (legacy in fragments) == (series == "wrynose")
    options = code_lines((kernel_dir / legacy).read_text())
    assert options == ["CONFIG_NETFILTER_XTABLES_LEGACY=y", "CONFIG_IP_NF_IPTABLES_LEGACY=m"]


def test_the_kernel_class_takes_the_series_fragment():
    text = (LAYER / "classes/gpu_k8s_linux_yocto.bbclass").read_text()
    assert re.search(r'^SRC_URI \+= "file://gpu-k8s-k3s\.cfg \$\{GPU_K8S_LINUX_YOCTO_SERIES_CFG\}"$', text, re.M)


@pytest.mark.parametrize("name", ["plugin", "updater"])
def test_recipes_built_from_the_repository_skip_when_only_the_layer_is_there(name):
    # yocto-check-layer copies the layer alone; wrynose's bitbake fails the whole parse at a
    # missing file:// entry, so the recipe must skip itself (gpu_k8s_repo_source.bbclass)
    users = [p for p in LAYER.rglob("*.bb") if f"file://{name}" in p.read_text().split("SRC_URI", 1)[-1]]
    assert users, f"no recipe builds {name}/"
    for recipe in users:
        text = recipe.read_text()
        assert re.search(r"^inherit .*\bgpu_k8s_repo_source\b", text, re.M), f"{recipe.name}"
        assert f'GPU_K8S_REPO_SOURCE = "{name}"' in text
        assert (recipe.parent / "../../.." / name).resolve().is_dir()
    # what installs them skips with them, or "bitbake world" fails on the missing provider
    group = (LAYER / "recipes-core/packagegroups/packagegroup-gpu-k8s.bb").read_text()
    assert re.search(r"^inherit .*\bgpu_k8s_repo_source\b", group, re.M)
    assert name in re.search(r'^GPU_K8S_REPO_SOURCE = "([^"]*)"$', group, re.M).group(1).split()
    klass = (LAYER / "classes/gpu_k8s_repo_source.bbclass").read_text()
    assert 'os.path.join(os.path.dirname(d.getVar("FILE")), "..", "..", "..")' in klass
    assert "bb.parse.SkipRecipe" in klass and 'getVar("GPU_K8S_REPO_SOURCE") or "").split()' in klass
