"""Issue 12: k3s from the official static release, pinned by hash, replacing
meta-virtualization's k3s only when the gpu-k8s distro feature asks."""

from __future__ import annotations

import configparser
import re

import pytest
import yaml
from bbfile import parse
from k3s_layer import K3S_DIR, k3s_recipe, requirements, resolve
from layer_paths import KAS, LAYER, REPO

SHA256 = re.compile(r"[0-9a-f]{64}")
# The hashes k3s publishes in sha256sum-amd64.txt / sha256sum-arm64.txt for v1.36.4+k3s1,
# each read in two independent stored copies (docs/layer.md names them).
PUBLISHED = {
    "k3s-amd64": "835873f37245fc615f547a2fe2af9402a347875f13fa64a1f136de644955ea3f",
    "k3s-arm64": "c920706346d5ad4e5cd3c7bf1bb09ce71ebe07fec829e513e40f1caf98aed8bb",
    "airgap-amd64": "9024613e2d468c51ba0e5ba21898604c41339354449fb3338cc6a7931189eb6a",
    "airgap-arm64": "9d3c4c2197bcf857ca17633aa393bad683cc982ddd408620f93036a3cca953b5",
}
ARCH_OVERRIDES = {"amd64": ("x86-64",), "arm64": ("aarch64",)}


def release_inc():
    return parse(K3S_DIR / "k3s-release.inc")


def version_inc():
    return parse(K3S_DIR / "k3s_version.inc")


def line_inc(line: str | None = None):
    """The hash set of a k3s line (default: the line machines run unless told otherwise)."""
    return parse(K3S_DIR / f"k3s-line-{line or version_inc().value('GPU_K8S_K3S_LINE')}.inc")


def src_uri_for(recipe, arch: str) -> list[str]:
    """SRC_URI entries of a recipe with the release variables expanded for one arch."""
    merged = parse(recipe)
    for inc in (line_inc(), version_inc(), release_inc()):
        merged.assignments = inc.assignments + merged.assignments
    text = resolve(merged, "SRC_URI", ARCH_OVERRIDES[arch])
    assert "${" not in text, text
    return text.split()


def checksums() -> dict[str, str]:
    return {a.flag[1:-1].split(".")[0]: a.value for a in line_inc().values("SRC_URI") if a.flag}


def test_release_is_a_supported_1_36_patch_release_and_matches_the_file_names():
    version = line_inc().value("K3S_VERSION")
    assert re.fullmatch(r"1\.36\.\d+", version), f"k3s {version} is not on the 1.36 line"
    assert version_inc().value("K3S_RELEASE") == "v${K3S_VERSION}+k3s1"
    for recipe in (k3s_recipe(), K3S_DIR / f"k3s-airgap-images_{version}.bb"):
        assert recipe.exists(), f"{recipe.name} missing: recipe file names carry the version"
    assert k3s_recipe().name == f"k3s_{version}.bb"
    assert requirements()["k3s_release"] == f"v{version}+k3s1", "kernel list is for another release"


def test_every_asset_is_pinned_by_the_published_sha256():
    sums = checksums()
    assert sums == PUBLISHED
    assert all(SHA256.fullmatch(value) for value in sums.values())


@pytest.mark.parametrize(("arch", "asset"), [("amd64", "k3s"), ("arm64", "k3s-arm64")])
def test_binary_url_and_download_name_are_per_arch_and_per_version(arch, asset):
    entries = src_uri_for(k3s_recipe(), arch)
    url, *params = entries[0].split(";")
    assert url == f"https://github.com/k3s-io/k3s/releases/download/v1.36.4+k3s1/{asset}"
    params = dict(p.split("=", 1) for p in params)
    assert params["name"] == f"k3s-{arch}" and params["name"] in checksums()
    assert params["downloadfilename"] == f"k3s-{arch}-v1.36.4+k3s1"
    assert all(e.startswith("file://") for e in entries[1:]), "only one download per arch"


@pytest.mark.parametrize("arch", ["amd64", "arm64"])
def test_airgap_images_are_fetched_and_pinned_the_same_way(arch):
    recipe = K3S_DIR / "k3s-airgap-images_1.36.4.bb"
    url, *params = src_uri_for(recipe, arch)[0].split(";")
    assert url.endswith(f"/v1.36.4+k3s1/k3s-airgap-images-{arch}.tar.zst")
    params = dict(p.split("=", 1) for p in params)
    assert params["name"] == f"airgap-{arch}" and params["name"] in checksums()
    assert params["downloadfilename"] == f"k3s-airgap-images-{arch}-v1.36.4+k3s1.tar.zst"


def test_only_x86_64_and_aarch64_are_buildable():
    inc = release_inc()
    assert inc.value("COMPATIBLE_HOST") == "(x86_64|aarch64).*-linux"
    assert inc.value("K3S_ARCH", "x86-64") == "amd64" and inc.value("K3S_ARCH", "aarch64") == "arm64"


def test_a_wrong_or_missing_hash_fails_the_fetch():
    assert release_inc().value("BB_STRICT_CHECKSUM") == "1"
    # Nothing in the layer or the kas files relaxes it.
    texts = [p.read_text() for p in LAYER.rglob("*") if p.is_file() and p.suffix in (".bb", ".bbappend", ".inc",
                                                                                     ".bbclass", ".conf")]
    texts += [p.read_text() for p in KAS.rglob("*.yml")]
    for text in texts:
        for value in re.findall(r'BB_STRICT_CHECKSUM\s*\S*=\s*"([^"]*)"', text):
            assert value == "1", f"BB_STRICT_CHECKSUM relaxed to {value!r}"


def test_packages_units_and_links_the_layer_relies_on():
    bb = parse(k3s_recipe())
    assert bb.value("PACKAGES").split()[:2] == ["${PN}-server", "${PN}-agent"]
    assert bb.value("SYSTEMD_SERVICE", "${PN}-server") == "k3s.service"
    assert bb.value("SYSTEMD_SERVICE", "${PN}-agent") == "k3s-agent.service"
    install = bb.tasks["do_install"]
    assert "ln -s k3s ${D}${bindir}/kubectl" in install and "ln -s k3s ${D}${bindir}/crictl" in install
    assert "${D}${bindir}/ctr" not in install, "docker's containerd owns /usr/bin/ctr"
    assert {"${PN}"} == set(bb.words("RDEPENDS", "${PN}-server")) == set(bb.words("RDEPENDS", "${PN}-agent"))
    assert "kubectl" in bb.words("RCONFLICTS", "${PN}")


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read_string((K3S_DIR / "files" / name).read_text())
    return parser


def test_server_unit_notifies_and_agent_unit_never_holds_boot():
    server, agent = unit("k3s.service"), unit("k3s-agent.service")
    assert server["Service"]["Type"] == "notify"
    assert server["Service"]["ExecStart"] == "@BINDIR@/k3s server"
    assert agent["Service"]["Type"] == "exec", "an agent waiting for its server must not hold boot"
    assert agent["Service"]["ExecStart"] == "@BINDIR@/k3s agent"
    assert agent["Service"]["ExecCondition"] == "@LIBEXECDIR@/k3s/k3s-agent-configured"
    for parsed in (server, agent):
        assert parsed["Service"]["Delegate"] == "yes" and parsed["Service"]["KillMode"] == "process"
        assert "ConditionPathExists" not in parsed["Unit"]
        assert parsed["Install"]["WantedBy"] == "multi-user.target"


def test_license_names_the_gpl_parts_and_cve_check_maps_the_binary():
    bb = parse(k3s_recipe())
    licenses = set(re.split(r"\s*&\s*", bb.value("LICENSE")))
    assert {"Apache-2.0", "GPL-2.0-only"} <= licenses
    for name in licenses:
        assert f"${{COMMON_LICENSE_DIR}}/{name};md5=" in bb.value("LIC_FILES_CHKSUM")
    inc = release_inc()
    assert "k3s" in inc.value("CVE_PRODUCT").split()
    assert inc.value("CVE_VERSION") == "${K3S_VERSION}"


def test_the_release_is_named_in_os_release():
    append = (LAYER / "recipes-core/os-release/os-release.bbappend").read_text()
    assert "'gpu-k8s', 'gpu_k8s_os_release'" in append
    klass = parse(LAYER / "classes/gpu_k8s_os_release.bbclass")
    assert "recipes-containers/k3s/k3s_version.inc" in klass.requires
    assert "GPU_K8S_K3S_VERSION" in klass.words("OS_RELEASE_FIELDS", "append")
    assert klass.value("GPU_K8S_K3S_VERSION") == "${K3S_RELEASE}"


# ---------------------------------------------------------------- the distro feature gate


def layer_conf() -> str:
    return (LAYER / "conf/layer.conf").read_text()


def test_our_k3s_exists_only_with_the_distro_feature():
    for recipe in (k3s_recipe(), K3S_DIR / "k3s-airgap-images_1.36.4.bb"):
        bb = parse(recipe)
        assert "features_check" in bb.inherits
        assert "gpu-k8s" in bb.words("REQUIRED_DISTRO_FEATURES")


def test_meta_virtualization_k3s_is_masked_only_with_the_distro_feature():
    mask = re.search(r'^BBMASK \+= "(.*)"$', layer_conf(), re.M).group(1)
    assert mask.startswith("${@bb.utils.contains('DISTRO_FEATURES', 'gpu-k8s', ")
    pattern = re.search(r"'gpu-k8s', '([^']+)', ''", mask).group(1)
    assert re.search(pattern, "/work/layers/meta-virtualization/recipes-containers/k3s/k3s_git.bb")
    assert not re.search(pattern, str(k3s_recipe())), "the mask must not hide our own k3s"


def test_every_bbappend_changes_its_recipe_only_with_a_distro_feature():
    appends = sorted(LAYER.rglob("*.bbappend"))
    assert {p.name for p in appends} >= {"linux-tegra_%.bbappend", "nvidia-docker_%.bbappend",
                                          "linux-yocto_%.bbappend", "os-release.bbappend"}
    feature = r"gpu-k8s(-[\w-]+)?"
    gated_path = (r"FILESEXTRAPATHS:prepend := \"\$\{@bb\.utils\.contains\('DISTRO_FEATURES', '" + feature
                  + r"', '\$\{THISDIR\}/[\w-]+:', '', d\)\}\"")
    for path in appends:
        code = [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
        paths = [line for line in code if line.startswith("FILESEXTRAPATHS")]
        if path.name.startswith("linux-"):
            # kernel-yocto checksums every fragment on FILESPATH: the directory is gated too.
            assert all(re.fullmatch(gated_path, line) for line in paths), \
                f"{path}: FILESEXTRAPATHS must be gated by the distro feature"
        # FILESEXTRAPATHS is otherwise in BB_HASHEXCLUDE_COMMON: it changes no signature by itself.
        code = [line for line in code if line not in paths]
        assert len(code) == 1, f"{path.name}: only the gated inherit may be outside a class: {code}"
        m = re.fullmatch(r"inherit \$\{@bb\.utils\.contains\('DISTRO_FEATURES', '" + feature + r"', '(\w+)', '', d\)\}",
                         code[0])
        assert m, f"{path.name}: {code[0]!r} is not the distro-feature-gated inherit"
        assert (LAYER / "classes" / f"{m.group(2)}.bbclass").exists()


def test_kas_builds_turn_the_distro_feature_on():
    text = "\n".join(yaml.safe_load((KAS / "include/common.yml").read_text())["local_conf_header"].values())
    features = re.search(r'^DISTRO_FEATURES:append\s*=\s*"([^"]*)"', text, re.M).group(1).split()
    assert "gpu-k8s" in features


def test_layer_readme_names_a_maintainer_and_how_to_send_patches():
    readme = (LAYER / "README.md").read_text()
    assert re.search(r"^## Maintainer", readme, re.M)
    assert re.search(r"[\w.+-]+@[\w-]+\.[\w.]+", readme), "a maintainer e-mail address"
    assert re.search(r"patch", readme, re.I)
    assert (REPO / "LICENSE").exists()


# ---------------------------------------------------------------- k3s lines per machine


def k3s_line_module():
    import sys

    sys.path.insert(0, str(LAYER / "lib"))
    from gpu_k8s import k3s_line

    return k3s_line


def test_every_carried_line_has_one_hash_set_and_its_recipes():
    k3s_line = k3s_line_module()
    lines = k3s_line.carried_lines([K3S_DIR])
    assert "1.36" in lines and version_inc().value("GPU_K8S_K3S_LINE") in lines
    for line in lines:
        inc = line_inc(line)
        version = inc.value("K3S_VERSION")
        assert version.startswith(line + "."), f"k3s-line-{line}.inc pins {version}"
        sums = {a.flag[1:-1].split(".")[0] for a in inc.values("SRC_URI") if a.flag}
        assert sums == set(PUBLISHED), f"k3s-line-{line}.inc must pin every asset"
        for recipe in (f"k3s_{version}.bb", f"k3s-airgap-images_{version}.bb"):
            assert (K3S_DIR / recipe).exists(), f"line {line} has no {recipe}"
    assert not release_inc().values("SRC_URI"), "hashes live in the line's file only"


def test_the_default_line_is_the_newest_carried_and_the_docs_say_why_a_newer_one_is_not():
    """Issue 37, point 10: machines run the newest line the layer can pin; a newer Kubernetes line
    that is not carried is named in docs/layer.md with the reason and the steps, and the sentence
    goes (the test fails) once its hash set is added."""
    k3s_line = k3s_line_module()
    lines = k3s_line.carried_lines([K3S_DIR])
    assert version_inc().value("GPU_K8S_K3S_LINE") == lines[-1], "machines default to the newest carried line"
    doc = (REPO / "docs/layer.md").read_text()
    for waiting in re.findall(r"\*\*k3s (\d+\.\d+) \(Kubernetes \1[^*]*\) is not carried yet\*\*", doc):
        assert waiting not in lines, f"docs/layer.md says k3s {waiting} is not carried, but k3s-line-{waiting}.inc is"
        assert tuple(map(int, waiting.split("."))) > tuple(map(int, lines[-1].split(".")))
        assert f"k3s-line-{waiting}.inc" in doc and "sha256sum-arm64.txt" in doc


def test_one_setting_moves_one_machine_to_another_line():
    """The Nano held on an older line, the others on the newest: each machine keeps the
    k3s recipe of its own line and skips the other, and a line without hashes is named."""
    k3s_line = k3s_line_module()
    pinned = {"1.36": "1.36.4", "1.37": "1.37.2"}  # two lines, as when the Nano is held back
    line_of = {"jetson-nano-devkit": "1.36", "genericx86-64": "1.37"}
    for machine, line in line_of.items():
        kept = [v for v in pinned.values() if not k3s_line.recipe_skip_reason(v, line, pinned[line])]
        assert kept == [pinned[line]], machine
        skipped = k3s_line.recipe_skip_reason(pinned["1.37" if line == "1.36" else "1.36"], line, pinned[line])
        assert f"GPU_K8S_K3S_LINE is {line}" in skipped
    problem = k3s_line.line_problem("1.35", None, ["1.36", "1.37"])
    assert problem == ('GPU_K8S_K3S_LINE is "1.35", but the layer carries no hash set for it '
                       "(recipes-containers/k3s/k3s-line-1.35.inc); lines carried: 1.36, 1.37")
    assert "minor line" in k3s_line.line_problem("1.36.4", "1.36.4", ["1.36"])
    assert k3s_line.line_problem("1.36", "1.36.4", ["1.36"]) == ""


def test_the_recipes_skip_other_lines_and_the_machine_line_is_checked_at_parse_time():
    release = (K3S_DIR / "k3s-release.inc").read_text()
    assert "recipe_skip_reason(d.getVar('PV'), d.getVar('GPU_K8S_K3S_LINE'), d.getVar('K3S_VERSION'))" in release
    assert "raise bb.parse.SkipRecipe(reason)" in release
    version = (K3S_DIR / "k3s_version.inc").read_text()
    assert 'GPU_K8S_K3S_LINE ??= "1.36"' in version, "a weak default: local.conf overrides it per machine"
    assert "include recipes-containers/k3s/k3s-line-${GPU_K8S_K3S_LINE}.inc" in version
    assert "bb.fatal(problem)" in version
