"""The docs' checkable facts against the code and files they describe (issue 37, point 9): each
test reads the doc sentence and the thing it is about, so a change to one without the other fails."""

from __future__ import annotations

import configparser
import re
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from tools.dev import suite
from tools.flash import provision
from tools.image import build, container
from tools.paths import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
TOOLING = (REPO_ROOT / "docs/tooling.md").read_text()
LAYER_DOC = (REPO_ROOT / "docs/layer.md").read_text()
PLUGIN_README = (REPO_ROOT / "plugin/README.md").read_text()
LAYER = REPO_ROOT / "meta-gpu-k8s"

# `plugin-oldest` (Python 3.10, `plugin/requirements-oldest.txt` ...; docs/tooling.md writes `.venvs/plugin-...`
LEG = re.compile(r"`(?:\.venvs/)?plugin-(\w+)`\s+\(Python\s+(3\.\d+),\s+`(plugin/requirements-[\w-]+\.txt)`")


def section(text: str, heading: str) -> str:
    """A markdown section's text, from its heading to the next heading of the same level or higher."""
    level = heading.split(" ", 1)[0]
    start = text.index(heading + "\n")
    following = [m.start() for m in re.finditer(rf"^#{{1,{len(level)}}} ", text[start + len(heading):], re.M)]
    return text[start:start + len(heading) + following[0]] if following else text[start:]


def test_the_readme_and_tooling_doc_list_the_suites_plugin_legs_as_they_are() -> None:
    legs = [(c.name, c.python_version, c.requirements) for c in suite.PLUGIN_COMBINATIONS]
    assert LEG.findall(README) == legs, "README.md's plugin legs differ from tools/dev/suite.py's"
    assert LEG.findall(section(TOOLING, "## test")) == legs, "docs/tooling.md's plugin legs differ"
    assert f"plugin's tests run in {['one', 'two', 'three', 'four', 'five'][len(legs) - 1]} legs" in README
    board = suite.PLUGIN_COMBINATIONS[0]
    assert f"The update agent's tests run on Python {board.python_version}" in README
    quick = [c for c in suite.PLUGIN_COMBINATIONS if c.name in suite.QUICK_SKIPS]
    assert {c.python_version for c in quick} == {"3.10"} and "`--quick` skips both 3.10 plugin legs" in README
    # the Go leg: named where the README lists the legs, described in docs/tooling.md's list
    assert f'The leg "{suite.GO_LEG}" needs Go' in README
    assert "`conformance/` (`tools/dev/go_conformance.py`)" in section(TOOLING, "## test")


def test_the_docs_say_the_summary_lists_every_legs_skips() -> None:
    """Issue 37, point 9: the summary's skip list, as docs/tooling.md and the README describe it."""
    tooling = " ".join(section(TOOLING, "## test").split())
    readme = " ".join(README.split())
    assert "every skipped test" in tooling
    assert "`go test -json`'s events" in tooling and "A leg that ran no test at all" in tooling
    assert "The summary lists every skipped test with its reason (pytest's, or go test's for the Go leg)" in readme


def test_the_provisioning_doc_names_the_files_flash_writes_and_where_they_appear() -> None:
    files = provision.node_files(provision.Provisioning(server_url="https://k3s:6443", token_file=Path("t")), "tok")
    links = {}
    for line in (LAYER / "recipes-core/gpu-k8s-data/files/node-config.list").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, path = line.split()[:2]
            links[name] = path
    paragraph = TOOLING[TOOLING.index("A freshly flashed A/B board"):]
    paragraph = paragraph[:paragraph.index("\n\n")]
    assert sorted(files) == ["gpu-k8s/node-config/k3s-config", "gpu-k8s/node-config/k3s-token"]
    for written in files:
        name = written.rsplit("/", 1)[1]
        assert f"`{written}`" in paragraph, f"docs/tooling.md does not name {written}"
        assert f"`{links[name]}`" in paragraph, f"docs/tooling.md does not say {name} appears as {links[name]}"
    assert "writes `config.yaml`" not in paragraph


def test_the_docker_the_images_carry_is_named_per_series() -> None:
    bullet = section(LAYER_DOC, "## What is in the image").split("\n- **k3s")[0]
    assert re.search(r"`docker-moby` [\d.]+\s+on wrynose", bullet), bullet
    assert re.search(r"`docker-ce` 20\.10 on the Nano's kirkstone", bullet), bullet
    assert "docker-ce 20.10 on the Nano's kirkstone" in LAYER_DOC  # the runtime table says the same


def test_the_orin_and_thor_pin_caveat_is_where_a_board_is_chosen_and_names_the_pin() -> None:
    pin = yaml.safe_load((REPO_ROOT / "kas/include/mender-tegra-native.yml").read_text())[
        "repos"]["meta-mender-community"]["commit"]
    boards = README[README.index("## Which image for which board"):README.index("## Two commands")]
    assert f"`{pin[:8]}`" in boards, "README.md's board section must name the Orin/Thor meta-mender-community pin"
    assert "git ls-remote https://github.com/mendersoftware/meta-mender-community wrynose" in boards
    assert f"`{pin[:8]}`" in LAYER_DOC


def test_the_plugin_readme_says_how_to_install_it_as_setup_cfg_and_the_unit_have_it() -> None:
    install = section(PLUGIN_README, "## Install")
    setup = configparser.ConfigParser()
    setup.read(REPO_ROOT / "plugin/setup.cfg")
    extras = setup["options.extras_require"]
    assert "pip install ./plugin" in install and "'./plugin[nvml]'" in install and "nvml" in extras
    script = setup["options.entry_points"]["console_scripts"].split("=")[0].strip()
    unit = (REPO_ROOT / "plugin/systemd/gpu-device-plugin.service").read_text()
    exec_start = re.search(r"^ExecStart=(\S+) --config-file (\S+)", unit, re.M)
    assert exec_start and exec_start.group(1) == f"/usr/bin/{script}"
    assert f"`{exec_start.group(1)} --config-file {exec_start.group(2)}`" in install
    assert f"/usr/bin/{script}" in install.split("```sh")[1], "the install block puts the command where the unit looks"
    recipe = (LAYER / "recipes-plugin/gpu-device-plugin/gpu-device-plugin_0.1.0.bb").read_text()
    assert "systemd/gpu-device-plugin.service" in recipe and "`systemd/gpu-device-plugin.service`" in install
    defaults = install.split("sudo install -D -m 0644 ")[1].split()[0]
    assert (REPO_ROOT / defaults).is_file(), f"the default config the README copies, {defaults}, does not exist"


def readme_hosts() -> str:
    return section(README, "## The first hour: what a build takes")


def test_the_readme_names_every_git_server_kas_clones_from() -> None:
    first_hour = readme_hosts()
    for machine, target in build.MACHINES.items():
        repos = container.layer_repositories([REPO_ROOT / part for part in target.kas_file.split(":")])
        for name, url in repos.items():
            host = urlsplit(url).hostname
            assert f"`{host}`" in first_hour, f"{machine}: kas clones {name} from {host}, which README.md does not name"
            assert name.replace("openembedded-core", "oe-core") in first_hour, f"{machine}: {name} not named"


def test_the_readme_names_every_download_host_of_our_recipes() -> None:
    hosts = set()
    for recipe in [*LAYER.rglob("*.bb"), *LAYER.rglob("*.inc")]:
        for assignment in re.findall(r'^(?:SRC_URI|K3S_RELEASE_URL|NVIDIA_\w+_URI)\s*\??=\s*"([^"]*)"',
                                     recipe.read_text(), re.M | re.S):
            hosts |= {urlsplit(url).hostname for url in re.findall(r"(?:https?|git)://[^\s;\"\\]+", assignment)}
    assert hosts >= {"github.com", "us.download.nvidia.com", "developer.download.nvidia.com",
                     "files.pythonhosted.org"}, hosts
    first_hour = readme_hosts()
    missing = sorted(host for host in hosts if f"`{host}`" not in first_hour)
    assert missing == [], f"README.md does not name these download hosts of our recipes: {missing}"


def test_the_readme_and_docs_describe_the_container_build_the_task_has() -> None:
    assert "./task build --container --dry-run" in README
    building = section(TOOLING, "### Building in a container")
    version = container.script_version(container.kas_container_executable())
    assert f"(kas {version})" in building and f"`ghcr.io/siemens/kas/kas:{version}`" in building
    for series, distro in container.IMAGE_DISTRO_BY_SERIES.items():
        assert f"`{distro}`" in building and series in building


def test_every_doc_gives_the_sd_card_orin_the_same_card_size() -> None:
    """Issue 37, point 9: the SD-card Orin's card size, once stated differently in two places;
    tests/tools/test_flash_orin.py proves the flash refusal names the same 64 GB."""
    sizes = {
        "README.md": re.findall(r"Orin Nano devkit, rootfs on its SD card \((\d+) GB or more\)", README),
        "docs/layer.md table": re.findall(r"SD card, `flash_t234_qspi_sd_rootfs_ab\.xml`.*a card of \*\*(\d+) GB\*\*",
                                          LAYER_DOC),
        "docs/layer.md": re.findall(r"The SD-card Orin needs a card of (\d+) GB or more", LAYER_DOC),
        "docs/tooling.md": re.findall(r"The SD-card Orin's card is (\d+) GB", TOOLING),
    }
    assert all(len(found) == 1 for found in sizes.values()), sizes
    assert {found[0] for found in sizes.values()} == {"64"}, sizes
