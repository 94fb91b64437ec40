"""check-image: the kas command it runs, its refusals, and the report from the probe's JSON
(a stand-in kas plays `kas shell ... -c probe` and writes what the real probe writes)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tools.image import build, check_image
from tools.image import closure as ic

REPO_ROOT = Path(__file__).resolve().parents[2]

# Plays kas: takes the probe's --out from the -c command line and writes the probe's JSON,
# here a Jetson closure as main had it before issue 8 (no machine extras, no CUDA).
KAS_STAND_IN = """
import shlex
inner = shlex.split(argv[argv.index('-c') + 1])
out = inner[inner.index('--out') + 1]
print('NOTE: Started PRServer with DBfile')
with open(os.environ['STAND_IN_PROBE_JSON']) as source, open(out, 'w') as target:
    target.write(source.read())
"""


def probe_json(tmp_path: Path, installed: list[str], overrides: list[str], arch: str, cuda: list[str],
               nvidia: str = "") -> Path:
    closure = ic.Closure()
    for name in installed:
        closure.installed[name] = ic.Installed(name, name, ic.BY_PACKAGE, name, ic.IMAGE, ic.IMAGE)
    data = {"image": "gpu-k8s-image", "machine": "jetson-nano-devkit", "machineoverrides": overrides,
            "target_arch": arch, "cuda_level": "runtime", "cuda_packages": cuda, "closure": closure.to_json(),
            "nvidia": nvidia}
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(data))
    return path


MAIN_JETSON_CLOSURE = ["docker-ce", "k3s", "k3s-server", "gpu-device-plugin", "python3-hpack",
                       "python3-pyyaml", "gpu-k8s-docker-config", "nvidia-container-runtime",
                       "nvidia-container-toolkit", "libnvidia-container-tools"]


def test_probe_runs_inside_kas_shell_with_the_build_dirs_of_the_machine(tmp_path: Path) -> None:
    options = check_image.CheckImageOptions(machine="jetson-nano")
    command = check_image.probe_command(options, "gpu-k8s-image", tmp_path / "out.json", environ={})
    assert command.argv[1:3] == ["shell", "kas/jetson-nano.yml"]
    inner = shlex.split(command.argv[command.argv.index("-c") + 1])
    assert inner[:2] == ["python3", str(REPO_ROOT / "tools" / "image" / "bitbake_probe.py")]
    assert inner[inner.index("--image") + 1] == "gpu-k8s-image"
    assert command.env["KAS_WORK_DIR"] == str(REPO_ROOT / "build" / "jetson-nano")


def test_a_kas_file_option_gets_its_own_work_dir() -> None:
    options = check_image.CheckImageOptions(kas_file="kas/x86-64.yml:kas/local.yml")
    command = check_image.probe_command(options, "gpu-k8s-image", Path("/tmp/x.json"), environ={})
    assert command.argv[2] == "kas/x86-64.yml:kas/local.yml"
    assert command.env["KAS_WORK_DIR"].endswith("build/check-x86-64")


def test_the_image_comes_from_target_then_the_kas_file_then_the_machine() -> None:
    assert check_image.image_for(check_image.CheckImageOptions(kas_file="kas/qemu-x86-64.yml")) == "gpu-k8s-image-dev"
    assert check_image.image_for(check_image.CheckImageOptions(kas_file="kas/x86-64.yml:kas/x.yml")) == "gpu-k8s-image"
    assert check_image.image_for(check_image.CheckImageOptions(machine="qemu", target="core-image-minimal")) == (
        "core-image-minimal")
    assert check_image.image_for(check_image.CheckImageOptions(machine="qemu")) == "gpu-k8s-image-dev"


def test_root_is_refused_in_one_line_before_kas_runs(stand_ins) -> None:
    with pytest.raises(check_image.CheckImageError, match="running as root.*fix:"):
        check_image.run_check_image(check_image.CheckImageOptions(), environ={}, euid=0)
    assert stand_ins.calls("kas") == []


def test_unknown_kas_file_is_refused(tmp_path: Path) -> None:
    options = check_image.CheckImageOptions(kas_file="kas/nope.yml", build_dir=tmp_path)
    with pytest.raises(check_image.CheckImageError, match="kas file kas/nope.yml does not exist"):
        check_image.run_check_image(options, environ={}, euid=1000)


def test_main_jetson_closure_is_reported_with_the_missing_driver(
    tmp_path: Path, stand_ins, monkeypatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stand_ins.add("kas", KAS_STAND_IN)
    monkeypatch.setattr(build, "kas_executable", lambda: "kas")
    tegra = ["aarch64", "tegra210", "cuda", "tegra", "jetson-nano-devkit"]
    json_path = probe_json(tmp_path, MAIN_JETSON_CLOSURE, tegra, "aarch64", ["tegra-libraries-cuda", "cuda-cudart"])
    monkeypatch.setenv("STAND_IN_PROBE_JSON", str(json_path))
    options = check_image.CheckImageOptions(machine="jetson-nano", build_dir=tmp_path / "work")
    findings = check_image.run_check_image(options, environ={}, euid=1000)
    lacking = {f.requirement.label for f in findings if not f.ok}
    assert lacking == {"kernel-module-nvgpu", "tegra-configs-udev", "tegra-libraries-cuda",
                       "tegra-libraries-cuda-container-csv", "cuda-cudart"}
    out = capsys.readouterr().out
    assert "MISSING  kernel-module-nvgpu: the GPU driver" in out
    assert "5 of 15 required pieces missing" in out
    (call,) = stand_ins.calls("kas")
    assert call["argv"][:2] == ["shell", "kas/jetson-nano.yml"]


def test_check_image_task_exits_2_with_one_line_for_a_bad_machine() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "invoke", "--search-root", str(REPO_ROOT), "check-image", "--machine", "rpi"],
        capture_output=True, text=True, check=False,
    )
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == [
        "error: unknown machine 'rpi'; choose one of: qemu, x86-64, x86-64-scarthgap, jetson-nano, "
        "jetson-orin-nano, jetson-orin-nano-sd, jetson-agx-orin, jetson-agx-thor, jetson-agx-thor-t4000"]
    assert "Traceback" not in completed.stdout + completed.stderr


def test_check_image_says_before_kas_runs_that_the_build_lacks_signing_keys(
    tmp_path: Path, stand_ins, monkeypatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stand_ins.add("kas", "print('ERROR - fetch repos failed: error code 128')\n", exit_code=1)
    monkeypatch.setattr(build, "kas_executable", lambda: "kas")
    options = check_image.CheckImageOptions(machine="jetson-nano", build_dir=tmp_path / "work")
    with pytest.raises(check_image.CheckImageError) as failure:
        check_image.run_check_image(options, environ={}, euid=1000)
    out = capsys.readouterr().out
    warning = out.index("would stop at do_rootfs: signed update artifacts are required")
    assert warning < out.index("resolving what"), "said before any kas work"
    assert "check the network" in str(failure.value) and "KAS_REPO_REF_DIR" in str(failure.value)


X86_CPU_CLOSURE = ["docker-moby", "k3s", "k3s-server", "gpu-device-plugin", "python3-hpack",
                   "python3-pyyaml", "gpu-k8s-docker-config", "kernel-module-br-netfilter", "kernel-module-ip-set",
                   "kernel-module-ip-set-hash-ip", "kernel-module-ip-set-hash-net", "kernel-module-xt-set"]


def test_an_x86_image_with_the_nvidia_knob_on_but_no_stack_is_told_what_each_piece_is_for(
    tmp_path: Path, stand_ins, monkeypatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stand_ins.add("kas", KAS_STAND_IN)
    monkeypatch.setattr(build, "kas_executable", lambda: "kas")
    json_path = probe_json(tmp_path, X86_CPU_CLOSURE, ["x86-64", "genericx86-64"], "x86_64", [], nvidia="1")
    monkeypatch.setenv("STAND_IN_PROBE_JSON", str(json_path))
    options = check_image.CheckImageOptions(machine="x86-64", build_dir=tmp_path / "work",
                                            accept_nvidia_licence=True)
    findings = check_image.run_check_image(options, environ={}, euid=1000)
    lacking = [f.requirement.label for f in findings
               if not f.ok and not f.requirement.label.startswith("kernel-module")]
    assert lacking == ["nvidia.ko (nvidia-open-gpu-kernel-modules)", "nvidia-driver-firmware",
                       "libnvidia-ml (nvidia-driver-libnvidia-ml)", "libcuda (nvidia-driver-libcuda)",
                       "nvidia-driver-tools", "nvidia-driver-persistenced", "nvidia-container-toolkit",
                       "gpu-k8s-nvidia-cdi", "python3-nvidia-ml-py"]
    out = capsys.readouterr().out
    assert "GPU_K8S_NVIDIA = 1" in out
    assert "MISSING  gpu-k8s-nvidia-cdi: the boot unit that loads the driver" in out


def test_an_x86_image_without_the_knob_is_not_asked_for_the_nvidia_stack(tmp_path: Path) -> None:
    data = json.loads(probe_json(tmp_path, X86_CPU_CLOSURE, ["x86-64", "genericx86-64"], "x86_64", []).read_text())
    result = check_image.ProbeResult.from_json(data)
    assert result.classes == ["x86-64"]
    asked = {name for f in check_image.closure_findings(result) for name in f.requirement.names}
    assert not asked & {"nvidia-driver-libcuda", "gpu-k8s-nvidia-cdi", "nvidia-container-toolkit"}


def test_accepting_the_nvidia_licence_adds_its_include_to_check_and_build() -> None:
    options = check_image.CheckImageOptions(machine="x86-64", accept_nvidia_licence=True)
    command = check_image.probe_command(options, "gpu-k8s-image", Path("/tmp/x.json"), environ={})
    assert command.argv[2] == "kas/x86-64.yml:kas/include/nvidia-licence.yml"
    assert (REPO_ROOT / build.NVIDIA_LICENCE_INCLUDE).is_file()
    plain = check_image.probe_command(check_image.CheckImageOptions(machine="x86-64"), "gpu-k8s-image",
                                      Path("/tmp/x.json"), environ={})
    assert plain.argv[2] == "kas/x86-64.yml", "nobody accepts the licence for the user"
    built = build.kas_build_command(build.BuildOptions(machine="x86-64", accept_nvidia_licence=True), environ={})
    assert built.argv[-1] == "kas/x86-64.yml:kas/include/nvidia-licence.yml"


def test_an_x86_image_without_the_licence_is_refused_before_kas_with_the_fix(tmp_path: Path, stand_ins,
                                                                            monkeypatch) -> None:
    stand_ins.add("kas", KAS_STAND_IN)
    monkeypatch.setattr(build, "kas_executable", lambda: "kas")
    options = check_image.CheckImageOptions(machine="x86-64", build_dir=tmp_path / "work")
    with pytest.raises(check_image.CheckImageError) as refused:
        check_image.run_check_image(options, environ={}, euid=1000)
    message = str(refused.value)
    assert "carries NVIDIA's driver, whose licence is not accepted" in message
    assert "pass --accept-nvidia-licence" in message and "\n" not in message
    assert stand_ins.calls("kas") == [], "refused before kas fetched a single layer"
    site = tmp_path / "work" / "build" / "conf" / "site.conf"
    site.parent.mkdir(parents=True)
    site.write_text('LICENSE_FLAGS_ACCEPTED:append = " nvidia-driver"\n')
    monkeypatch.setenv("STAND_IN_PROBE_JSON", str(probe_json(tmp_path, X86_CPU_CLOSURE, ["x86-64"], "x86_64", [],
                                                             nvidia="1")))
    check_image.run_check_image(options, environ={}, euid=1000)
    assert len(stand_ins.calls("kas")) == 1
    scarthgap = check_image.CheckImageOptions(machine="x86-64-scarthgap", build_dir=tmp_path / "work2")
    check_image.run_check_image(scarthgap, environ={}, euid=1000)  # carries no NVIDIA stack: not asked


def test_check_image_as_root_says_check_image_cannot_run_as_root_and_how_to_rerun_it(tmp_path: Path) -> None:
    options = check_image.CheckImageOptions(machine="x86-64", role="agent", accept_nvidia_licence=True)
    with pytest.raises(check_image.CheckImageError) as refused:
        check_image.run_check_image(options, environ={}, euid=0)
    message = str(refused.value)
    assert message.startswith("running as root: check-image parses the recipes with bitbake, which refuses to run "
                              "as root")
    assert "then as builder: cd meta-gpu-k8s && ./task check-image --machine x86-64 --role agent " \
           "--accept-nvidia-licence" in message
    assert "./task build" not in message


def test_the_role_picks_the_kas_include_the_work_dir_and_the_k3s_unit_asked_for(tmp_path: Path) -> None:
    agent = check_image.CheckImageOptions(machine="x86-64", role="agent", accept_nvidia_licence=True)
    command = check_image.probe_command(agent, "gpu-k8s-image", Path("/tmp/x.json"), environ={})
    assert command.argv[2] == "kas/x86-64.yml:kas/include/agent.yml:kas/include/nvidia-licence.yml"
    assert command.env["KAS_WORK_DIR"].endswith("/build/x86-64-agent"), "the agent build's own work dir"
    nano = check_image.CheckImageOptions(machine="jetson-nano", role="agent")
    assert check_image.probe_command(nano, "gpu-k8s-image", Path("/x"), environ={}).argv[2] == "kas/jetson-nano.yml"
    with_kas = check_image.CheckImageOptions(kas_file="kas/jetson-orin-nano.yml", role="agent")
    assert check_image.kas_file_for(with_kas) == "kas/jetson-orin-nano.yml:kas/include/agent.yml"
    data = json.loads(probe_json(tmp_path, X86_CPU_CLOSURE, ["x86-64"], "x86_64", []).read_text())
    result = check_image.ProbeResult.from_json(data)  # the closure holds k3s-server
    def missing(role: str | None) -> set[str]:
        return {f.requirement.label for f in check_image.closure_findings(result, role) if not f.ok}

    assert missing("agent") - missing(None) == {"k3s-agent"}, "an image asked for as an agent must carry its unit"
    assert missing("server") == missing(None)


def test_the_probe_finds_the_closure_module_beside_it(tmp_path: Path) -> None:
    # Inside `kas shell` the probe loads image/closure.py by its path, not as tools.image.closure:
    # a rename that missed it would stop check-image only after kas had set up the layers.
    completed = subprocess.run([sys.executable, str(check_image.PROBE), "--help"], cwd=tmp_path,
                               env={"PATH": os.defpath}, capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    assert "--image IMAGE" in completed.stdout
