"""CDI spec: what runtimes get for each backend, and that Allocate's CDI names resolve in it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from gpu_device_plugin.cdi import spec as cdi
from gpu_device_plugin.config.settings import Settings, TimeSlicing
from gpu_device_plugin.core import policy
from gpu_device_plugin.discovery.tegra import TegraBackend
from gpu_device_plugin.host.paths import host_path_exists
from gpu_device_plugin.model import Gpu

FIXTURES = Path(__file__).parent / "fixtures"
KIND = "meta-gpu-k8s.io/gpu"
CONTROL = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
RO_BIND = ["ro", "nosuid", "nodev", "bind"]

# Modelled on L4T R32.7's l4t.csv / cuda.csv (written for these tests, much shorter): the
# runtime's format is "<kind>, <absolute path>", one a line.
L4T_CSV = """\
# Jetson platform files for containers (sample in the L4T R32.7 style)
dev, /dev/nvhost-ctrl
dev, /dev/nvhost-ctrl-gpu
dev, /dev/nvhost-gpu
dev, /dev/nvmap
dev, /dev/fb0
dev, /dev/nvhost-nvdla0

lib, /usr/lib/aarch64-linux-gnu/tegra/libcuda.so.1.1
lib, /usr/lib/aarch64-linux-gnu/tegra/libnvrm_gpu.so
sym, /usr/lib/aarch64-linux-gnu/tegra/libcuda.so
sym, /usr/lib/aarch64-linux-gnu/libcuda.so
this line is not a csv entry
lib /usr/lib/aarch64-linux-gnu/tegra/libnvos.so
"""
CUDA_CSV = """\
dir, /usr/local/cuda-10.2
lib, /usr/local/cuda-10.2/lib64/libcudart.so.10.2.300
"""
# On a Nano: no DLA (Xavier only), and the CUDA toolkit directory is installed.
NANO_MISSING = {"/dev/nvhost-nvdla0"}


def nvml_gpu(i: int, mig: bool = False) -> Gpu:
    return Gpu(id=f"GPU-{i}f6e2b1c-55aa-4c3e-9d1e-00000000000{i}", index=i, name="Tesla T4", backend="nvml",
               device_nodes=(f"/dev/nvidia{i}", *CONTROL), mig_enabled=mig)


def nano_gpu() -> Gpu:
    [gpu] = TegraBackend(str(FIXTURES / "jetson-nano")).discover()
    return gpu


def sim_gpu(i: int) -> Gpu:
    return Gpu(id=f"sim-gpu-{i}", index=i, name="Simulated GPU", backend="simulated")


def by_name(spec: dict) -> dict[str, dict]:
    return {d["name"]: d for d in spec["devices"]}


def node_paths(edits: dict) -> list[str]:
    return [n["path"] for n in edits.get("deviceNodes", [])]


def nano_spec(warnings: list[str] | None = None) -> dict:
    return cdi.build_spec([nano_gpu()], Settings(), {"l4t.csv": L4T_CSV, "cuda.csv": CUDA_CSV},
                          exists=lambda p: p not in NANO_MISSING,
                          warn=(warnings.append if warnings is not None else lambda _: None))


# ---------------------------------------------------------------- NVML


def test_nvml_gpus_get_own_node_per_device_and_control_nodes_spec_wide() -> None:
    """Proves per-GPU isolation: asking for GPU 1 never brings /dev/nvidia0, while the control
    nodes every CUDA process needs come with any GPU, listed once."""
    gpus = [nvml_gpu(0), nvml_gpu(1)]
    spec = cdi.build_spec(gpus, Settings())
    devices = by_name(spec)
    assert spec["kind"] == KIND
    assert list(devices) == ["0", gpus[0].id, "1", gpus[1].id]
    assert node_paths(devices["1"]["containerEdits"]) == ["/dev/nvidia1"]
    assert devices[gpus[1].id]["containerEdits"] == devices["1"]["containerEdits"]
    assert node_paths(spec["containerEdits"]) == list(CONTROL)
    assert all(n["permissions"] == "rw" for n in spec["containerEdits"]["deviceNodes"])


def test_cdi_version_is_the_lowest_that_loads_the_spec() -> None:
    """Proves the version choice: index names start with a digit, which CDI allows from 0.5.0
    (older loaders would refuse them), and a dotted class needs 0.6.0."""
    assert cdi.build_spec([nvml_gpu(0)], Settings())["cdiVersion"] == "0.5.0"
    dotted = cdi.build_spec([nvml_gpu(0)], Settings(cdi_kind="example.com/gpu.t4"))
    assert dotted["cdiVersion"] == "0.6.0"
    assert cdi.minimum_version({"kind": KIND, "devices": [{"name": "gpu0", "containerEdits": {}}]}) == "0.3.0"


def test_mig_gpus_are_left_out_and_a_spec_with_nothing_to_describe_is_refused() -> None:
    """Proves the spec matches what is advertised (MIG GPUs are never handed out whole) and that
    an empty spec, which CDI loaders reject, is never produced."""
    spec = cdi.build_spec([nvml_gpu(0, mig=True), nvml_gpu(1)], Settings())
    assert set(by_name(spec)) == {"1", nvml_gpu(1).id}
    with pytest.raises(ValueError, match="no GPU that can be handed out"):
        cdi.build_spec([nvml_gpu(0, mig=True)], Settings())


# ---------------------------------------------------------------- the cross-check with Allocate


@pytest.mark.parametrize("id_strategy", ["uuid", "index"])
@pytest.mark.parametrize("replicas", [1, 3])
@pytest.mark.parametrize("backend", ["tegra", "simulated"])  # NVML: the toolkit's spec (test_toolkit_cdi)
def test_every_cdi_name_allocate_returns_exists_in_the_spec(backend: str, id_strategy: str, replicas: int) -> None:
    """The important one: a CDI name Allocate hands out that the spec lacks makes the runtime fail
    the container. For each backend, ID strategy and time-slicing, every name returned resolves."""
    gpus = {"nvml": [nvml_gpu(0), nvml_gpu(1)], "tegra": [nano_gpu()], "simulated": [sim_gpu(0), sim_gpu(1)]}[backend]
    settings = Settings(device_list_strategy=("cdi-cri",), device_id_strategy=id_strategy,
                        time_slicing=TimeSlicing(replicas=replicas))
    spec = cdi.build_spec(gpus, settings, {"l4t.csv": L4T_CSV})
    names = set(by_name(spec))
    advertised = {d.id: d for d in policy.advertised_devices(gpus, settings)}
    requests = [[i] for i in advertised] + [list(advertised)]
    returned = [n for ids in requests for n in policy.allocate(ids, advertised, settings).cdi_devices]
    assert returned
    for qualified in returned:
        kind, _, name = qualified.partition("=")
        assert kind == spec["kind"]
        assert name in names, f"Allocate returned {qualified} but the spec only has {sorted(names)}"


def test_cdi_annotations_name_the_same_devices() -> None:
    """Proves the annotation strategy's values resolve too (same names, comma-joined)."""
    gpus = [nvml_gpu(0), nvml_gpu(1)]
    settings = Settings(device_list_strategy=("cdi-annotations",), device_id_strategy="index")
    names = set(by_name(cdi.build_spec(gpus, settings)))
    advertised = {d.id: d for d in policy.advertised_devices(gpus, settings)}
    [value] = policy.allocate(list(advertised), advertised, settings).annotations.values()
    assert {q.partition("=")[2] for q in value.split(",")} <= names


# ---------------------------------------------------------------- Tegra


def test_jetson_nano_spec_carries_gpu_nodes_csv_nodes_and_read_only_library_mounts() -> None:
    """Proves the CSV translation: dev -> device nodes (not repeated when the GPU already has
    them), lib/sym/dir -> read-only bind mounts at the same path, parents mounted first."""
    gpu = nano_gpu()
    spec = nano_spec()
    device = by_name(spec)["0"]
    assert set(by_name(spec)) == {"0", gpu.id}
    assert node_paths(device["containerEdits"]) == list(gpu.device_nodes)
    assert "/dev/nvhost-gpu" in gpu.device_nodes
    assert node_paths(spec["containerEdits"]) == ["/dev/fb0"]
    mounts = spec["containerEdits"]["mounts"]
    assert [m["hostPath"] for m in mounts] == [
        "/usr/lib/aarch64-linux-gnu/libcuda.so",
        "/usr/lib/aarch64-linux-gnu/tegra/libcuda.so",
        "/usr/lib/aarch64-linux-gnu/tegra/libcuda.so.1.1",
        "/usr/lib/aarch64-linux-gnu/tegra/libnvrm_gpu.so",
        "/usr/local/cuda-10.2",
        "/usr/local/cuda-10.2/lib64/libcudart.so.10.2.300",
    ]
    assert all(m["containerPath"] == m["hostPath"] and m["options"] == RO_BIND for m in mounts)


def test_csv_entries_missing_on_the_host_are_dropped() -> None:
    """Proves the exists filter: L4T lists Xavier's DLA node on every board, and a CDI device
    node whose host file is absent makes the runtime refuse the container."""
    paths = json.dumps(nano_spec())
    assert "/dev/nvhost-nvdla0" not in paths
    spec = cdi.build_spec([nano_gpu()], Settings(), {"cuda.csv": CUDA_CSV}, exists=lambda p: False)
    assert "mounts" not in spec.get("containerEdits", {})


def test_malformed_csv_lines_are_skipped_and_named_in_one_warning() -> None:
    """Proves a bad line costs only itself: both malformed lines are reported with file and line
    number, the comment and blank line are not, and every good line still makes it in."""
    warnings: list[str] = []
    spec = nano_spec(warnings)
    assert len(warnings) == 1
    assert "l4t.csv:13" in warnings[0] and "l4t.csv:14" in warnings[0] and "2 malformed" in warnings[0]
    assert "Jetson platform files" not in warnings[0]
    assert "libnvos.so" not in json.dumps(spec)


def test_parse_csv_follows_the_runtimes_format() -> None:
    """Proves the line rules: split on the first comma, spaces trimmed, only dev/lib/sym/dir and
    absolute paths accepted."""
    entries, bad = cdi.parse_csv("dev,/dev/nvmap\n  sym ,  /a/b,c.so  \nlib, relative.so\nfoo, /x\n#dev, /y\n", "t")
    assert [(e.kind, e.path) for e in entries] == [("dev", "/dev/nvmap"), ("sym", "/a/b,c.so")]
    assert bad == ["t:3: 'lib, relative.so'", "t:4: 'foo, /x'"]


def test_tegra_without_csv_files_warns_but_still_gives_the_device_nodes() -> None:
    """Proves a Jetson without the runtime's CSV package gets a usable spec and one clear line
    saying the CUDA libraries will be missing, not a crash."""
    warnings: list[str] = []
    spec = cdi.build_spec([nano_gpu()], Settings(), None, warn=warnings.append)
    assert node_paths(by_name(spec)["0"]["containerEdits"])
    assert len(warnings) == 1 and "no CSV files" in warnings[0]


def test_csv_files_are_ignored_for_discrete_gpus() -> None:
    """Proves Jetson files on an x86 box (e.g. a copied rootfs) never leak into an NVML spec."""
    spec = cdi.build_spec([nvml_gpu(0)], Settings(), {"l4t.csv": L4T_CSV})
    assert "libcuda" not in json.dumps(spec)


# ---------------------------------------------------------------- simulated


def test_simulated_gpus_get_an_env_edit_so_the_spec_is_valid() -> None:
    """Proves simulated GPUs (no device nodes) still form a valid spec, with a distinct variable
    per GPU so two allocated GPUs do not overwrite each other."""
    spec = cdi.build_spec([sim_gpu(0), sim_gpu(1)], Settings())
    devices = by_name(spec)
    assert devices["0"]["containerEdits"] == {"env": ["SIMULATED_GPU_0=sim-gpu-0"]}
    assert devices["sim-gpu-1"]["containerEdits"] == {"env": ["SIMULATED_GPU_1=sim-gpu-1"]}
    assert "containerEdits" not in spec


# ---------------------------------------------------------------- validation


def test_ids_that_are_not_valid_cdi_names_are_refused_with_the_name() -> None:
    """Proves a GPU ID the runtime could not parse never reaches disk; the error names it."""
    bad = nvml_gpu(0)._replace(id="GPU/0")
    with pytest.raises(ValueError, match=r"'GPU/0': invalid CDI device name"):
        cdi.build_spec([bad], Settings())
    with pytest.raises(ValueError, match="invalid CDI device name"):
        cdi.build_spec([nvml_gpu(0)._replace(id="GPU-0-")], Settings())


def test_duplicate_names_are_refused() -> None:
    """Proves two GPUs that would answer to the same name (an ID equal to another's index) fail
    loudly instead of one silently shadowing the other."""
    with pytest.raises(ValueError, match="'1': device name used twice"):
        cdi.build_spec([nvml_gpu(0)._replace(id="1"), nvml_gpu(1)], Settings())


def test_relative_device_node_paths_and_bad_kinds_are_refused() -> None:
    """Proves validation covers device node paths and the kind's vendor/class form."""
    with pytest.raises(ValueError, match="'dev/nvidia0' is not an absolute path"):
        cdi.build_spec([nvml_gpu(0)._replace(device_nodes=("dev/nvidia0",))], Settings())
    for kind in ("gpu", "vendor.com/", "vendor.com/gpu/x", "1vendor.com/gpu", "vendor.com/gpu-"):
        with pytest.raises(ValueError, match="must be vendor/class"):
            cdi.build_spec([nvml_gpu(0)], Settings()._replace(cdi_kind=kind))


def test_validate_spec_checks_version_edits_and_devices() -> None:
    """Proves hand-made or edited specs are checked too: version, empty device, bad env."""
    good = cdi.build_spec([nvml_gpu(0)], Settings())
    cdi.validate_spec(good)
    for change, message in (
        ({"cdiVersion": "0.4.0"}, "too old"),
        ({"cdiVersion": "0.9.9"}, "not a released CDI version"),
        ({"devices": []}, "at least one device"),
        ({"devices": [{"name": "x", "containerEdits": {}}]}, "at least one edit"),
        ({"devices": [{"name": "x", "containerEdits": {"env": ["=1"]}}]}, "NAME=value"),
    ):
        with pytest.raises(ValueError, match=message):
            cdi.validate_spec({**good, **change})


# ---------------------------------------------------------------- files


def test_write_spec_writes_0644_json_that_round_trips(tmp_path: Path) -> None:
    """Proves the file a runtime reads: conventional name, world-readable, JSON equal to the spec,
    and the directory created when missing."""
    spec = nano_spec()
    path = cdi.write_spec(spec, str(tmp_path / "run" / "cdi"), KIND)
    assert path == str(tmp_path / "run" / "cdi" / "meta-gpu-k8s.io-gpu.json")
    assert os.stat(path).st_mode & 0o777 == 0o644
    assert json.loads(Path(path).read_text()) == spec
    assert os.listdir(tmp_path / "run" / "cdi") == ["meta-gpu-k8s.io-gpu.json"]


def test_unchanged_spec_is_not_rewritten(tmp_path: Path) -> None:
    """Proves a rescan with the same GPUs does not touch the file (runtimes reload on change)."""
    spec = cdi.build_spec([nvml_gpu(0)], Settings())
    path = cdi.write_spec(spec, str(tmp_path), KIND)
    inode = os.stat(path).st_ino
    cdi.write_spec(spec, str(tmp_path), KIND)
    assert os.stat(path).st_ino == inode
    cdi.write_spec(cdi.build_spec([nvml_gpu(0), nvml_gpu(1)], Settings()), str(tmp_path), KIND)
    assert os.stat(path).st_ino != inode  # a change goes through the atomic rename


def test_failed_rename_leaves_old_spec_intact_and_no_temp_file(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Proves atomicity: when the final step fails, readers still see the old complete spec, no
    temp file remains, and the error names the path and what to do."""
    old = cdi.build_spec([nvml_gpu(0)], Settings())
    path = cdi.write_spec(old, str(tmp_path), KIND)

    def refuse(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cdi.os, "replace", refuse)
    with pytest.raises(OSError) as caught:
        cdi.write_spec(cdi.build_spec([nvml_gpu(0), nvml_gpu(1)], Settings()), str(tmp_path), KIND)
    message = str(caught.value)
    assert path in message and "No space left" in message and "--cdi-spec-dir" in message
    assert caught.value.errno == 28
    assert os.listdir(tmp_path) == ["meta-gpu-k8s.io-gpu.json"]
    assert json.loads(Path(path).read_text()) == old


def test_failed_write_midway_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Proves no half-written file survives a failure while writing the data (first write)."""
    def broken_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(cdi.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="cannot write CDI spec"):
        cdi.write_spec(cdi.build_spec([nvml_gpu(0)], Settings()), str(tmp_path), KIND)
    assert os.listdir(tmp_path) == []


def test_unusable_spec_dir_raises_oserror_naming_it(tmp_path: Path) -> None:
    """Proves a spec dir that cannot be created (a file is in the way) gives one clear error."""
    blocker = tmp_path / "cdi"
    blocker.write_text("not a directory")
    with pytest.raises(OSError, match=f"cannot write CDI spec {blocker}/meta-gpu-k8s.io-gpu.json"):
        cdi.write_spec(cdi.build_spec([nvml_gpu(0)], Settings()), str(blocker), KIND)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")
def test_read_only_spec_dir_raises_and_leaves_nothing(tmp_path: Path) -> None:
    """Proves the permission case as a non-root user meets it: error, no file, no temp file."""
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(OSError, match="writable by the plugin"):
            cdi.write_spec(cdi.build_spec([nvml_gpu(0)], Settings()), str(tmp_path), KIND)
        assert os.listdir(tmp_path) == []
    finally:
        tmp_path.chmod(0o755)


def test_stale_temp_files_from_a_killed_writer_are_cleared(tmp_path: Path) -> None:
    """Proves a temp file left by a SIGKILL mid-write does not pile up across restarts."""
    stale = tmp_path / ".meta-gpu-k8s.io-gpu.json.abc123.tmp"
    stale.write_text("{")
    cdi.write_spec(cdi.build_spec([nvml_gpu(0)], Settings()), str(tmp_path), KIND)
    assert not stale.exists()


def test_write_refuses_invalid_or_mismatched_specs(tmp_path: Path) -> None:
    """Proves nothing invalid reaches disk, even when the caller hands in its own dict."""
    spec = cdi.build_spec([nvml_gpu(0)], Settings())
    with pytest.raises(ValueError, match="does not match"):
        cdi.write_spec(spec, str(tmp_path), "other.com/gpu")
    with pytest.raises(ValueError, match="at least one device"):
        cdi.write_spec({**spec, "devices": []}, str(tmp_path), KIND)
    assert os.listdir(tmp_path) == []


def test_remove_spec_deletes_ours_only_once(tmp_path: Path) -> None:
    """Proves shutdown / CDI-off cleanup removes the file and tolerates it being gone."""
    cdi.write_spec(cdi.build_spec([nvml_gpu(0)], Settings()), str(tmp_path), KIND)
    (tmp_path / "nvidia.com-gpu.yaml").write_text("someone else's")
    assert cdi.remove_spec(str(tmp_path), KIND) is True
    assert cdi.remove_spec(str(tmp_path), KIND) is False
    assert os.listdir(tmp_path) == ["nvidia.com-gpu.yaml"]


# ---------------------------------------------------------------- the host side, end to end


def nano_host(tmp_path: Path) -> Path:
    """The Jetson Nano fixture plus the runtime's CSV files and the files they name."""
    root = tmp_path / "host"
    shutil.copytree(FIXTURES / "jetson-nano", root)
    csv_dir = root / cdi.CSV_DIR.lstrip("/")
    csv_dir.mkdir(parents=True)
    (csv_dir / "l4t.csv").write_text(L4T_CSV)
    (csv_dir / "cuda.csv").write_text(CUDA_CSV)
    (csv_dir / "README").write_text("not a csv file")
    (root / "dev" / "fb0").write_text("")
    tegra = root / "usr/lib/aarch64-linux-gnu/tegra"
    tegra.mkdir(parents=True)
    (tegra / "libcuda.so.1.1").write_text("")
    (tegra / "libnvrm_gpu.so").write_text("")
    (tegra / "libcuda.so").symlink_to("libcuda.so.1.1")
    # absolute, as L4T's alternatives links are: must resolve inside the host root
    (root / "usr/lib/aarch64-linux-gnu/libcuda.so").symlink_to("/usr/lib/aarch64-linux-gnu/tegra/libcuda.so")
    cuda = root / "usr/local/cuda-10.2/lib64"
    cuda.mkdir(parents=True)
    (cuda / "libcudart.so.10.2.300").write_text("")
    return root


def test_sync_spec_on_a_jetson_nano_tree_writes_what_the_host_has(tmp_path: Path) -> None:
    """Proves the wiring the daemon uses: CSV files read under host_root, entries checked under it
    (absolute symlinks included), spec written, and removed again when CDI is switched off."""
    root = nano_host(tmp_path)
    gpus = TegraBackend(str(root)).discover()
    settings = Settings(device_list_strategy=("cdi-cri",), host_root=str(root), cdi_spec_dir=str(tmp_path / "cdi"))
    assert sorted(cdi.read_csv_files(str(root))) == ["cuda.csv", "l4t.csv"]
    path = cdi.sync_spec(gpus, settings, warn=lambda _: None)
    assert path is not None
    spec = json.loads(Path(path).read_text())
    assert spec == nano_spec()
    assert cdi.sync_spec(gpus, settings._replace(device_list_strategy=("envvar",))) is None
    assert not Path(path).exists()


def test_host_path_exists_resolves_links_inside_the_root(tmp_path: Path) -> None:
    """Proves links are followed within host_root (not the plugin's own /), dangling links and
    loops count as missing, and '..' cannot climb out of the root."""
    root = nano_host(tmp_path)
    assert host_path_exists(str(root), "/usr/lib/aarch64-linux-gnu/libcuda.so")
    assert host_path_exists(str(root), "/dev/nvhost-gpu")
    assert not host_path_exists(str(root), "/dev/nvhost-nvdla0")
    (root / "dangling").symlink_to("/nowhere")
    (root / "loop").symlink_to("/loop")
    assert not host_path_exists(str(root), "/dangling")
    assert not host_path_exists(str(root), "/loop")
    assert host_path_exists(str(root), "/../../dev/nvmap")
    assert not host_path_exists(str(root), "/../" + tmp_path.name)


def test_read_csv_files_without_the_directory_is_empty(tmp_path: Path) -> None:
    """Proves a host without the container runtime simply has no CSV files (no exception)."""
    assert cdi.read_csv_files(str(tmp_path)) == {}
