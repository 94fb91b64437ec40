"""Issue 23, the layer half: the Jetson Orin's A/B images (Mender through meta-mender-tegra's
native scheme on wrynose), its data partition from the first flash, no verifier committing a new
slot before the health gate, the hardware watchdog, signing enforced whatever the artifact type."""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import tegra_layouts as tl
from bbfile import parse
from layer_paths import KAS, LAYER, REPO
from test_kas import load, merged

sys.path.insert(0, str(LAYER / "lib"))
sys.path.insert(0, str(REPO))
from gpu_k8s import tegra_layout, tegra_sdcard

from tools.flash import make_sdcard, orin

CLASS = LAYER / "classes/gpu_k8s_mender.bbclass"
DYNAMIC = LAYER / "dynamic-layers/mender-tegra"
SCHEME_LAYERS = {"meta-mender-tegra/meta-mender-tegra-common", "meta-mender-tegra/meta-mender-tegra-native",
                 "meta-mender-tegra/meta-mender-tegra-jetpack7"}


def class_assignments() -> dict[str, str]:
    return {":".join((a.var, *a.overrides)): a.value for a in parse(CLASS).assignments}


def series_value(series: str, var: str) -> str:
    found = re.findall(rf'^{var} = "([^"]*)"$', (LAYER / f"conf/series/{series}.inc").read_text(), re.M)
    assert len(found) == 1, f"{series}.inc: {var} set {len(found)} times"
    return found[0]


# ---------------------------------------------------------------- kas


def test_the_orin_builds_with_meta_mender_tegra_native_pinned_on_wrynose_and_locked():
    conf = merged(KAS / "jetson-orin-nano.yml")
    community = conf["repos"]["meta-mender-community"]
    assert community["url"] == "https://github.com/mendersoftware/meta-mender-community.git"
    assert community["branch"] == "wrynose"
    assert re.fullmatch(r"[0-9a-f]{40}", community["commit"])
    assert set(community["layers"]) == SCHEME_LAYERS, "common + exactly one scheme layer + the JetPack layer"
    lock = load(KAS / "jetson-orin-nano.lock.yml")["overrides"]["repos"]
    assert lock["meta-mender-community"]["commit"] == community["commit"]
    text = (KAS / "include/mender-tegra-native.yml").read_text()
    assert re.search(r"^    # wrynose, \d{4}-\d{2} \(pull request #530", text, re.M), "say where the pin came from"


def test_the_nano_keeps_its_kirkstone_jetpack4_layer():
    community = merged(KAS / "jetson-nano.yml")["repos"]["meta-mender-community"]
    assert (community["branch"], set(community["layers"])) == (
        "kirkstone", {"meta-mender-tegra/meta-mender-tegra-jetpack4"})


@pytest.mark.parametrize("name", ["jetson-orin-nano.yml", "jetson-nano.yml"])
def test_every_jetson_build_is_an_ab_image_whose_keys_come_from_the_environment(name):
    conf = merged(KAS / name)
    text = "\n".join(conf["local_conf_header"].values())
    assert re.search(r'^INHERIT \+= "gpu_k8s_mender"$', text, re.M)
    assert "tegra-mender" not in text, "the scheme class is the layer's choice (conf/series/), not the kas file's"
    assert all(var in conf["env"] and conf["env"][var] is None
               for var in ("MENDER_ARTIFACT_SIGNING_KEY", "MENDER_ARTIFACT_VERIFY_KEY", "GPU_K8S_ARTIFACT_SIGNING"))


@pytest.mark.parametrize("machine", ["jetson-orin-nano", "jetson-orin-nano-sd", "jetson-agx-orin"])
def test_an_orin_build_without_keys_is_refused_before_kas_starts(machine, tmp_path):
    # ./task build runs this before any build work (tools/image/preflight.py, the layer's own rule),
    # on the kas file as build.py names it: a machine override is joined with a colon
    from tools.image import build, preflight
    kas_file = preflight.kas_paths(build.MACHINES[machine].kas_file, root=REPO)
    problem = preflight.signing_problem(kas_file, "gpu-k8s-image", {}, tmp_path / "site.conf")
    assert "MENDER_ARTIFACT_SIGNING_KEY and MENDER_ARTIFACT_VERIFY_KEY are not set" in problem
    assert preflight.signing_problem(kas_file, "gpu-k8s-image", {"GPU_K8S_ARTIFACT_SIGNING": "off"},
                                     tmp_path / "site.conf") == ""


def test_role_includes_share_one_block_so_the_last_one_wins():
    agent, server = (load(KAS / f"include/{role}.yml")["local_conf_header"] for role in ("agent", "server"))
    assert set(agent) == set(server) == {"meta-gpu-k8s-role"}
    # the role, and the device type of its own where the role is not the machine's default
    # (docs/fleet.md): an agent everywhere but the Nano, a server on the Nano
    assert agent["meta-gpu-k8s-role"].strip().splitlines() == [
        'GPU_K8S_K3S_ROLE = "agent"', 'MENDER_DEVICE_TYPE = "${MACHINE}-agent"',
        'MENDER_DEVICE_TYPE:tegra210 = "${MACHINE}"']
    assert server["meta-gpu-k8s-role"].strip().splitlines() == [
        'GPU_K8S_K3S_ROLE = "server"', 'MENDER_DEVICE_TYPE:tegra210 = "${MACHINE}-server"']


# ---------------------------------------------------------------- the scheme, per series


def run_scheme_choice(overrides: str, collections: str, series: str) -> str:
    """The class's own gpu_k8s_tegra_mender_class, run against a fake datastore."""
    text = CLASS.read_text()
    source = re.search(r"^def gpu_k8s_tegra_mender_class\(d\):\n(?:    .*\n)+", text, re.M).group(0)

    class Fatal(Exception):
        pass

    class Bb:
        @staticmethod
        def fatal(message: str) -> None:
            raise Fatal(message)

    values = {"MACHINEOVERRIDES": overrides, "BBFILE_COLLECTIONS": collections, "MACHINE": "m",
              "GPU_K8S_TEGRA_MENDER_CLASS": series_value(series, "GPU_K8S_TEGRA_MENDER_CLASS"),
              "GPU_K8S_TEGRA_MENDER_LAYER": series_value(series, "GPU_K8S_TEGRA_MENDER_LAYER")}

    class Data:
        def getVar(self, name: str) -> str:  # bitbake's name
            return values[name]

    namespace = {"bb": Bb}
    exec(compile(source, str(CLASS), "exec"), namespace)
    try:
        return namespace["gpu_k8s_tegra_mender_class"](Data())
    except Fatal as error:
        return f"FATAL {error}"


def test_the_class_inherits_the_series_scheme_only_on_jetson():
    assert re.search(r"^inherit \$\{@gpu_k8s_tegra_mender_class\(d\)\}$", CLASS.read_text(), re.M)
    orin = "aarch64:armv8-2a:cuda:tegra:tegra234:orin-nano:jetson-orin-nano-devkit"
    native = "core meta-mender-tegra-common meta-mender-tegra-native tegra"
    assert run_scheme_choice(orin, native, "wrynose") == "tegra-mender-native"
    assert run_scheme_choice("aarch64:tegra210:cuda:tegra", "core meta-mender-tegra-jetpack4 tegra",
                             "kirkstone") == "tegra-mender-setup"
    assert run_scheme_choice("x86-64:genericx86-64", "core", "wrynose") == ""
    refused = run_scheme_choice(orin, "core tegra", "wrynose")
    assert refused.startswith("FATAL ") and "meta-mender-tegra-native" in refused
    assert "kas/jetson-orin-nano.yml" in refused, "the message names the fix"


def test_the_series_name_the_scheme_layer_the_kas_files_bring():
    assert series_value("wrynose", "GPU_K8S_TEGRA_MENDER_LAYER") == "meta-mender-tegra-native"
    assert series_value("kirkstone", "GPU_K8S_TEGRA_MENDER_LAYER") == "meta-mender-tegra-jetpack4"
    conf = (LAYER / "conf/layer.conf").read_text()
    # every Orin bbappend applies only with the scheme layer it changes
    assert re.search(r"^BBFILES_DYNAMIC \+= \"meta-mender-tegra-native:\$\{LAYERDIR\}/dynamic-layers/mender-tegra/",
                     conf, re.M)


def test_uefi_jetsons_build_no_uboot_and_only_the_nano_reserves_uboot_space():
    values = class_assignments()
    assert "mender-uboot" in values["MENDER_FEATURES_DISABLE:append:tegra234"].split()
    assert "TEGRA_MENDER_RESERVED_SPACE_MB:tegra" not in values
    assert values["TEGRA_MENDER_RESERVED_SPACE_MB:tegra210"] == "1974"


def test_the_dangling_go_client_append_is_masked_on_wrynose_only():
    text = (LAYER / "conf/series/wrynose.inc").read_text()
    assert 'BBMASK += "/meta-mender-tegra-common/recipes-mender/mender-client/mender-client_"' in text
    assert "mender-client_" not in (LAYER / "conf/series/kirkstone.inc").read_text()


def test_the_capsule_guid_is_settled_before_the_first_flash():
    # meta-tegra docs/UEFI-Capsule-Update.md: the t23x "general" configuration's GUID
    assert class_assignments()["TEGRA_UEFI_SYSTEM_IMAGE_TYPE_GUID:tegra234"] == "bf0d4599-20d4-414e-b2c5-3595b1cda402"


# ---------------------------------------------------------------- signing in every scheme


def signing_check(image_fstypes: str) -> str:
    values = class_assignments()
    expression = re.fullmatch(r"\$\{@(.*)\}", values["GPU_K8S_ARTIFACT_SIGNING_CHECK"]).group(1)
    store = {"GPU_K8S_ARTIFACT_TYPES": values["GPU_K8S_ARTIFACT_TYPES"], "IMAGE_FSTYPES": image_fstypes}

    class Data:
        def getVar(self, name: str) -> str:  # bitbake's name
            return store[name]

    return eval(expression, {"d": Data()})


def test_signing_is_checked_for_every_artifact_type_the_schemes_write():
    # the Orin's IMAGE_FSTYPES as the native scheme leaves it ("mender" removed on tegra)
    assert signing_check("tegraflash-tar.zst tegraflash-tar dataimg tegra-mender-native") == (
        "gpu_k8s_check_artifact_signing")
    assert signing_check("mender uefiimg uefiimg.bmap") == "gpu_k8s_check_artifact_signing"
    assert signing_check("ext4 tar.bz2") == ""
    text = CLASS.read_text()
    assert re.search(r'^do_rootfs\[prefuncs\] \+= "\$\{GPU_K8S_ARTIFACT_SIGNING_CHECK\}"$', text, re.M)
    for task in ("do_image_mender", "do_image_tegra_mender_native"):
        assert re.search(rf'^{task}\[prefuncs\] \+= "gpu_k8s_check_artifact_signing"$', text, re.M), task


# ---------------------------------------------------------------- the data partition


def placed(text: str) -> tegra_layout.Placement:
    result = tegra_layout.place_data_partition(text, "permanet_user_storage", 1024 * 1024 * 1024)
    assert result is not None
    return result


@pytest.mark.parametrize(("layout", "device"), [
    (tl.NVME_EXTERNAL, "external"), (tl.SD_TEMPLATE, "sdcard"), (tl.EMMC_TEMPLATE, "sdmmc_user")])
def test_every_orin_rootfs_device_gets_a_trailing_data_partition_numbered_as_mender_mounts_it(layout, device):
    result = placed(layout)
    assert (result.device, result.number, result.appended) == (device, 17, True)
    assert str(result.number) == class_assignments()["MENDER_DATA_PART_NUMBER:tegra234"]
    names = [p.get("name") for p in ET.fromstring(result.text).iter("partition")]
    assert names[names.index("APP_b") + 1] == "permanet_user_storage", "right after the second slot"
    data = next(p for p in ET.fromstring(result.text).iter("partition") if p.get("name") == "permanet_user_storage")
    assert int(data.findtext("allocation_attribute").strip(), 16) & 0x800, "fills the rest of the device"
    assert data.findtext("size").strip() == str(1024 * 1024 * 1024)
    assert tegra_layout.datafile_partitions(result.text) == ["permanet_user_storage"]
    # NVIDIA's own partitions keep their numbers: UDA 15, the slots 1 and 2
    numbers = tegra_layout.partition_numbers(result.text)[device]
    assert (numbers["UDA"], numbers["APP"], numbers["APP_b"]) == (15, 1, 2)


def test_the_data_image_moves_off_uda_where_meta_mender_tegra_put_it():
    result = placed(tl.NVME_EXTERNAL_DATA_ON_UDA)
    assert tegra_layout.datafile_partitions(result.text) == ["permanet_user_storage"]
    uda = next(p for p in ET.fromstring(result.text).iter("partition") if p.get("name") == "UDA")
    assert uda.find("filename") is None, "UDA back as NVIDIA ships it"


def test_a_boot_device_only_layout_is_left_alone():
    assert tegra_layout.place_data_partition(tl.NVME_TEMPLATE, "permanet_user_storage", 1 << 30) is None


def test_the_boot_device_ids_do_not_leak_into_the_data_partitions_number():
    # the QSPI's 60 partitions (ids ignored there) sit in the same SD template as the card
    spi = tegra_layout.partition_numbers(tl.SD_TEMPLATE)["spi"]
    assert max(spi.values()) == 60
    assert placed(tl.SD_TEMPLATE).number == 17


def test_placing_twice_changes_nothing_the_second_time():
    once = placed(tl.EMMC_TEMPLATE)
    twice = placed(once.text)
    assert (twice.text, twice.number, twice.appended) == (once.text, 17, False)


def test_a_data_partition_appended_upstream_is_adopted_and_carries_the_data_image():
    upstream = tl.NVME_EXTERNAL.replace(
        tl.partition("secondary_gpt", "secondary_gpt", size="0xFFFFFFFFFFFFFFFF"),
        tl.partition("permanet_user_storage", pid=17, attribute="0x808")
        + tl.partition("secondary_gpt", "secondary_gpt", size="0xFFFFFFFFFFFFFFFF"))
    result = placed(upstream)
    assert (result.number, result.appended) == (17, False)
    assert tegra_layout.datafile_partitions(result.text) == ["permanet_user_storage"]


@pytest.mark.parametrize(("shape", "complaint"), [
    ("before", "comes before the rootfs slots"), ("fixed", "does not fill to the end")])
def test_a_data_partition_that_could_never_grow_is_refused(shape, complaint):
    if shape == "before":
        text = tl.NVME_EXTERNAL.replace(tl.partition("reserved"),
                                        tl.partition("reserved") + tl.partition("permanet_user_storage",
                                                                                attribute="0x808"))
    else:
        text = tl.NVME_EXTERNAL.replace(
            tl.partition("secondary_gpt", "secondary_gpt", size="0xFFFFFFFFFFFFFFFF"),
            tl.partition("permanet_user_storage", pid=17)
            + tl.partition("secondary_gpt", "secondary_gpt", size="0xFFFFFFFFFFFFFFFF"))
    with pytest.raises(tegra_layout.LayoutError, match=complaint):
        placed(text)


def test_a_layout_with_two_rootfs_devices_is_ambiguous():
    with pytest.raises(tegra_layout.LayoutError, match="more than one device"):
        placed(tl.layout(tl.rootfs_device("sdcard"), tl.rootfs_device("external")))


NVFLASHXMLPARSE = Path(os.environ.get("YOCTO_PARSE_ROOT", "/var/tmp/yocto-parse")) / \
    "sources-wrynose/meta-tegra/recipes-bsp/tegra-binaries/tegra-helper-scripts/nvflashxmlparse.py"


@pytest.mark.skipif(not NVFLASHXMLPARSE.is_file(), reason="meta-tegra wrynose work tree (yocto-parse) not here")
@pytest.mark.parametrize(("layout", "kind"), [(tl.NVME_EXTERNAL, "external"), (tl.SD_TEMPLATE, "sdcard"),
                                              (tl.EMMC_TEMPLATE, "sdmmc_user")])
def test_meta_tegras_own_parser_numbers_the_data_partition_as_we_do(layout, kind, tmp_path):
    # nvflashxmlparse turns the layout into the GPT (tegra-flash-helper, make-sdcard, initrd-flash)
    # with the sizes filled in, as tegra-flash-helper.sh does before it asks the parser
    path = tmp_path / "layout.xml"
    path.write_text(placed(layout).text.replace("NUM_SECTORS", "250069680").replace("APPSIZE", "15032385536"))
    out = subprocess.run([sys.executable, str(NVFLASHXMLPARSE), "-t", kind, str(path)],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    line = next(row for row in out.splitlines() if 'partname="permanet_user_storage"' in row)
    assert "partnumber=17;" in line and 'partfile="DATAFILE"' in line and "partfilltoend=1" in line


def test_the_layout_class_is_applied_after_install_and_checks_the_number_mender_mounts():
    append = (DYNAMIC / "recipes-bsp/tegra-binaries/tegra-storage-layout-base_%.bbappend").read_text()
    assert re.search(r"^inherit \$\{@bb\.utils\.contains\('DISTRO_FEATURES', 'gpu-k8s-mender', "
                     r"'gpu_k8s_mender_tegra_layout', '', d\)\}$", append, re.M)
    klass = (LAYER / "classes/gpu_k8s_mender_tegra_layout.bbclass").read_text()
    assert re.search(r'^do_install\[postfuncs\] \+= "gpu_k8s_mender_tegra_layout"$', klass, re.M)
    assert "MENDER_DATA_PART_NUMBER" in klass and "bb.fatal" in klass


def test_the_orin_data_image_is_a_floor_that_grows():
    values = class_assignments()
    assert int(values["MENDER_DATA_PART_SIZE_MB_DEFAULT:tegra234"]) >= 512


def sd_card_layout() -> str:
    """The SD-card Orin's flash.xml.in as its package carries it: NVIDIA's partition sizes, two
    slots of half meta-tegra's ROOTFSPART_SIZE_DEFAULT, the layer's data partition after APP_b
    sized as the data image (MENDER_DATA_PART_SIZE_MB)."""
    data_bytes = int(class_assignments()["MENDER_DATA_PART_SIZE_MB_DEFAULT:tegra234"]) * 1024 * 1024
    text = tegra_layout.place_data_partition(tl.SD_TEMPLATE_SIZED, "permanet_user_storage", data_bytes).text
    return tl.as_packaged(text, tl.ROOTFSPART_SIZE_DEFAULT // 2)


def test_the_sd_card_size_is_one_value_the_layer_and_flash_take_and_the_whole_layout_fits_it():
    size = tegra_sdcard.ORIN_SD_CARD_SIZE
    # the layer states it from the one place (a literal here would be a second place of truth)
    assert class_assignments()["TEGRAFLASH_SDCARD_SIZE:jetson-orin-nano-devkit"] == (
        "${@gpu_k8s_lib(d, 'gpu_k8s.tegra_sdcard').ORIN_SD_CARD_SIZE}")
    # flash makes the SD image with it (dosdcard.sh -s)
    assert orin.ORIN_TARGETS["jetson-orin-nano-devkit"].sd_card_size == size
    # every partition make-sdcard creates fits the card, the data partition's image included
    needed = make_sdcard.needed_bytes(sd_card_layout())
    room = make_sdcard.card_sectors(size) * make_sdcard.SECTOR_BYTES
    assert needed <= room, f"the layout needs {needed} bytes, a {size} SD image holds {room}"
    # and not a card of half that size: what flash asked for before (-s 32G), whose make-sdcard failed
    assert needed > make_sdcard.card_sectors("32G") * make_sdcard.SECTOR_BYTES
    assert make_sdcard.card_to_buy(needed) == int(size.removesuffix("G"))


def test_the_docs_name_the_sd_card_the_layer_lays_out_for():
    gigabytes = tegra_sdcard.ORIN_SD_CARD_SIZE.removesuffix("G") + " GB"
    readme_row = next(line for line in (REPO / "README.md").read_text().splitlines() if "`jetson-orin-nano-sd`" in line)
    assert f"({gigabytes} or more)" in readme_row
    layer_row = next(line for line in (REPO / "docs/layer.md").read_text().splitlines()
                     if line.startswith("| `jetson-orin-nano-devkit` |"))
    assert f"a card of **{gigabytes}** or more" in layer_row
    tooling = (REPO / "docs/tooling.md").read_text()
    assert f"`dosdcard.sh -s {tegra_sdcard.ORIN_SD_CARD_SIZE}`" in tooling
    # no other size offered for it (flash once asked for -s 32G: "32 GB layout")
    others = re.findall(r"-s (\d+)G\b|\b(\d+) ?GB? layout", tooling + (REPO / "README.md").read_text())
    assert {size for pair in others for size in pair if size} <= {tegra_sdcard.ORIN_SD_CARD_SIZE.removesuffix("G")}


# ---------------------------------------------------------------- slot verification


def unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(path)
    return parser


def test_no_verifier_runs_without_the_pending_marker_on_data():
    files = DYNAMIC / "recipes-mender/tegra-rootfs-update-module/files"
    verify = unit(files / "50-gpu-k8s-pending-on-data.conf")
    # /var/lib/mender is a link to /data/mender, where the update module leaves the marker
    assert verify["Unit"]["RequiresMountsFor"] == "/data/mender"
    nvidia = (files / "50-gpu-k8s-marker-aware.conf").read_text()
    assert re.search(r"^ExecStart=\nExecStart=/usr/sbin/tegra-rootfs-verify$", nvidia, re.M), (
        "meta-tegra's unconditional `nvbootctrl verify` replaced, not added to")
    assert unit(files / "50-gpu-k8s-marker-aware.conf")["Unit"]["RequiresMountsFor"] == "/data/mender"
    klass = (LAYER / "classes/gpu_k8s_mender_tegra_verify.bbclass").read_text()
    for service, dropin in (("tegra-rootfs-verify", "50-gpu-k8s-pending-on-data.conf"),
                            ("nv_update_verifier", "50-gpu-k8s-marker-aware.conf")):
        assert f"${{systemd_system_unitdir}}/{service}.service.d/" in klass and dropin in klass
    append = (DYNAMIC / "recipes-mender/tegra-rootfs-update-module/tegra-rootfs-update-module_%.bbappend").read_text()
    assert re.search(r"^inherit \$\{@bb\.utils\.contains\('DISTRO_FEATURES', 'gpu-k8s-mender', "
                     r"'gpu_k8s_mender_tegra_verify', '', d\)\}$", append, re.M)


def test_the_mender_daemon_that_could_commit_stays_off():
    assert class_assignments()["SYSTEMD_AUTO_ENABLE:pn-mender"] == "disable"


# ---------------------------------------------------------------- watchdog


def test_the_orin_kernel_gets_the_tegra_watchdog_with_the_ab_class():
    cfg = (DYNAMIC / "recipes-kernel/watchdog/files/gpu-k8s-watchdog-tegra.cfg").read_text()
    options = dict(line.split("=", 1) for line in cfg.splitlines() if line.startswith("CONFIG_"))
    # timer-tegra186.c's Kconfig: bool, depends on WATCHDOG && WATCHDOG_CORE
    assert {k: options.get(k) for k in ("CONFIG_WATCHDOG", "CONFIG_WATCHDOG_CORE", "CONFIG_TEGRA186_TIMER")} == {
        "CONFIG_WATCHDOG": "y", "CONFIG_WATCHDOG_CORE": "y", "CONFIG_TEGRA186_TIMER": "y"}
    watchdog = parse(LAYER / "classes/gpu_k8s_mender_watchdog.bbclass")
    assert watchdog.words("SRC_URI", "append", "tegra234") == ["file://gpu-k8s-watchdog-tegra.cfg"]
    append = (DYNAMIC / "recipes-kernel/watchdog/linux-noble-nvidia-tegra_%.bbappend").read_text()
    assert "'gpu-k8s-mender', 'gpu_k8s_mender_watchdog'" in append
    assert "'gpu-k8s-mender', '${THISDIR}/files:'" in append, "the fragment joins FILESPATH only with the feature"


# ---------------------------------------------------------------- what the image carries


def test_only_the_mender_disk_images_are_built_on_x86_64():
    image = parse(LAYER / "recipes-core/images/gpu-k8s-image.inc")
    removed = set(image.words("IMAGE_FSTYPES", "remove", "gpu-k8s-mender"))
    # meta-yocto-bsp's genericx86-common.inc: "wic wic.bmap" to scarthgap, "wic.zst wic.bmap" on wrynose
    assert {"wic", "wic.bmap", "wic.zst"} <= removed
    assert not {"mender", "uefiimg", "uefiimg.bmap"} & removed


@pytest.mark.parametrize(("series", "units"), [
    ("kirkstone", "mender-client-data-dir.service mender-client-systemd-machine-id.service"),
    ("scarthgap", "mender-data-dir.service mender-systemd-machine-id.service"),
    ("wrynose", "mender-data-dir.service mender-systemd-machine-id.service")])
def test_the_data_unit_wants_the_first_boot_units_meta_mender_of_its_series_ships(series, units):
    assert series_value(series, "GPU_K8S_MENDER_FIRSTBOOT_UNITS") == units
    service = (LAYER / "recipes-core/gpu-k8s-data/files/gpu-k8s-data.service").read_text()
    assert "Wants=@MENDER_FIRSTBOOT_UNITS@" in service
    recipe = parse(LAYER / "recipes-core/gpu-k8s-data/gpu-k8s-data_1.0.bb")
    assert "s#@MENDER_FIRSTBOOT_UNITS@#${GPU_K8S_MENDER_FIRSTBOOT_UNITS}#g" in recipe.tasks["do_install"]


def test_the_l4t_launcher_takes_the_device_tree_without_the_boot_prefix():
    append = (DYNAMIC / "recipes-bsp/uefi/l4t-launcher-extlinux.bbappend").read_text()
    assert "'gpu-k8s-mender', 'gpu_k8s_mender_tegra_extlinux'" in append
    klass = (LAYER / "classes/gpu_k8s_mender_tegra_extlinux.bbclass").read_text()
    assert re.search(r'^UBOOT_EXTLINUX_FDT:jetson-orin-nano-devkit = "\$\{DTBFILE\}"$', klass, re.M)


def test_the_repository_carries_no_copy_of_meta_mender_community():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert not [p for p in tracked.split() if "meta-mender-tegra-" in p.split("/")[0]]
