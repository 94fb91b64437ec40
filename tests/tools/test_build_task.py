"""build: host checks, the kas command line, progress, artifacts and failures."""

from __future__ import annotations

import io
import os
from dataclasses import replace as dataclass_replace
from pathlib import Path

import pytest
from signing_keys import ec_key, write_pair

from tools import process
from tools.image import build, hostcheck
from tools.image import requirements as req

GIB = 1024**3

KAS_STAND_IN = """
target = argv[argv.index('--target') + 1]
build_dir = env['KAS_BUILD_DIR']
print('NOTE: Starting bitbake server...')
for number in range(1, 4):
    print(f'NOTE: Running task {number} of 3 (/layers/poky/meta/recipes-core/busybox/busybox.bb:do_compile)')
deploy = os.path.join(build_dir, 'tmp', 'deploy', 'images', 'qemux86-64')
os.makedirs(deploy, exist_ok=True)
real = os.path.join(deploy, target + '-qemux86-64.rootfs-20260101.ext4')
with open(real, 'wb') as image:
    image.write(b'\\0' * 4096)
os.symlink(os.path.basename(real), os.path.join(deploy, target + '-qemux86-64.rootfs.ext4'))
with open(os.path.join(deploy, 'bzImage'), 'wb') as kernel:
    kernel.write(b'\\0' * 1024)
with open(os.path.join(deploy, 'unrelated.txt'), 'w') as other:
    other.write('not an artifact')
with open(os.path.join(deploy, target + '-qemux86-64.manifest'), 'w') as manifest:
    for name in env['STAND_IN_MANIFEST'].split():
        manifest.write(name + ' core2_64 1.0\\n')
"""

# What a complete QEMU image's manifest lists (docker comes as docker-ce, its provider).
FULL_QEMU_MANIFEST = [
    "docker-ce" if r.label == "docker" else r.names[0]
    for r in req.requirements_for([req.X86_64, req.QEMU])
] + ["busybox", "systemd"]


@pytest.fixture
def fit_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "refuse_unfit_host", lambda options, env: [])


def options_in(tmp_path: Path, **overrides) -> build.BuildOptions:
    return build.BuildOptions(build_dir=tmp_path / "qemu", **overrides)


def test_default_build_is_the_qemu_dev_image_with_its_kas_file(tmp_path: Path) -> None:
    command = build.kas_build_command(options_in(tmp_path), environ={})
    assert command.argv[1:] == ["build", "--target", "gpu-k8s-image-dev", "kas/qemu-x86-64.yml"]


def test_machine_choice_picks_kas_file_and_default_image(tmp_path: Path) -> None:
    command = build.kas_build_command(options_in(tmp_path, machine="jetson-nano"), environ={})
    assert command.argv[-1] == "kas/jetson-nano.yml"
    assert "gpu-k8s-image" in command.argv


def test_unknown_machine_names_the_choices() -> None:
    with pytest.raises(build.BuildUsageError, match="choose one of: qemu, x86-64, x86-64-scarthgap, jetson-nano"):
        build.machine_target("raspberrypi4")


def test_every_top_level_kas_file_is_a_machine_with_its_machine_and_target() -> None:
    import yaml

    from tools.paths import REPO_ROOT

    top = sorted(f"kas/{p.name}" for p in (REPO_ROOT / "kas").glob("*.yml") if not p.name.endswith(".lock.yml"))
    # a machine may be a top-level file with overrides after it (a.yml:b.yml, as kas merges them)
    firsts = {t.kas_file.split(":")[0] for t in build.MACHINES.values()}
    assert sorted(firsts) == top, "a kas file without --machine, or the reverse"
    for target in build.MACHINES.values():
        conf: dict = {}
        for part in target.kas_file.split(":"):
            conf.update(yaml.safe_load((REPO_ROOT / part).read_text()))
        assert (conf["machine"], conf["target"]) == (target.yocto_machine, target.default_image), target.kas_file


def test_caches_come_from_environment_and_options_win(tmp_path: Path) -> None:
    environ = {
        "DL_DIR": "/srv/downloads",
        "SSTATE_MIRRORS": "file://.* http://cache/PATH",
        "BB_NUMBER_THREADS": "4",
        "UNRELATED": "x",
    }
    options = options_in(tmp_path, settings={"BB_NUMBER_THREADS": "16", "PARALLEL_MAKE": "-j 16"})
    env = build.build_environment(options, environ)
    assert env["DL_DIR"] == "/srv/downloads"
    assert env["SSTATE_MIRRORS"] == "file://.* http://cache/PATH"
    assert env["BB_NUMBER_THREADS"] == "16"
    assert env["PARALLEL_MAKE"] == "-j 16"
    assert "UNRELATED" not in env
    assert env["KAS_BUILD_DIR"] == str(tmp_path / "qemu" / "build")


def test_dry_run_prints_the_exact_command_and_runs_nothing(
    tmp_path: Path, stand_ins, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_ins.add("kas", KAS_STAND_IN)
    monkeypatch.setattr(build, "kas_executable", lambda: "kas")
    monkeypatch.setattr(build, "refuse_unfit_host", lambda o, e: [])
    assert build.run_build(options_in(tmp_path, dry_run=True), environ={}) == []
    out = capsys.readouterr().out
    assert "would run: cd " in out
    assert "kas build --target gpu-k8s-image-dev kas/qemu-x86-64.yml" in out
    assert stand_ins.calls("kas") == []


def test_a_dry_run_that_a_real_build_would_stop_at_shows_the_commands_and_fails(
    tmp_path: Path, stand_ins, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_ins.add("kas", KAS_STAND_IN)
    monkeypatch.setattr(build, "kas_executable", lambda: "kas")
    monkeypatch.setattr(build, "refuse_unfit_host", lambda o, e: [hostcheck.Problem("running as root", "x")])
    with pytest.raises(build.BuildError, match="dry run: a real build would stop at the 1 problem"):
        build.run_build(options_in(tmp_path, dry_run=True), environ={})
    out = capsys.readouterr().out
    assert "a real build would stop here" in out
    assert "kas build --target gpu-k8s-image-dev kas/qemu-x86-64.yml" in out, "the commands are still shown"
    assert stand_ins.calls("kas") == []


def test_unfit_host_is_refused_before_kas_runs(tmp_path: Path, stand_ins, monkeypatch) -> None:
    stand_ins.add("kas", KAS_STAND_IN)
    monkeypatch.setattr(build, "kas_executable", lambda: "kas")
    monkeypatch.setattr(build, "refuse_unfit_host", lambda o, e: hostcheck.check_not_root(0))
    with pytest.raises(build.BuildError, match="cannot build yet"):
        build.run_build(options_in(tmp_path), environ={})
    assert stand_ins.calls("kas") == []


def test_build_runs_kas_and_lists_artifacts_with_sizes(
    tmp_path: Path, stand_ins, fit_host, monkeypatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stand_ins.add("kas", KAS_STAND_IN)
    monkeypatch.setattr(build, "kas_executable", lambda: "kas")
    monkeypatch.setenv("STAND_IN_MANIFEST", " ".join(FULL_QEMU_MANIFEST))
    environ = {"SSTATE_MIRRORS": "file://.* http://cache/PATH"}
    artifacts = build.run_build(options_in(tmp_path), environ=environ)
    names = {a.path.name for a in artifacts}
    assert names == {
        "gpu-k8s-image-dev-qemux86-64.rootfs-20260101.ext4",
        "gpu-k8s-image-dev-qemux86-64.rootfs.ext4",
        "gpu-k8s-image-dev-qemux86-64.manifest",
        "bzImage",
    }
    link = next(a for a in artifacts if a.link_target)
    assert link.size_bytes == 4096
    out = capsys.readouterr().out
    assert "4.0 KiB" in out and "built gpu-k8s-image-dev for qemu" in out
    (call,) = stand_ins.calls("kas")
    assert call["argv"] == ["build", "--target", "gpu-k8s-image-dev", "kas/qemu-x86-64.yml"]
    log = (tmp_path / "qemu" / "build" / "kas-build.log").read_text()
    assert "Running task 3 of 3" in log
    assert "ok       kernel-module-br-netfilter" in out


def test_build_fails_when_the_manifest_lacks_a_required_piece(
    tmp_path: Path, stand_ins, fit_host, monkeypatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stand_ins.add("kas", KAS_STAND_IN)
    monkeypatch.setattr(build, "kas_executable", lambda: "kas")
    lacking = [name for name in FULL_QEMU_MANIFEST if name != "kernel-module-br-netfilter"]
    monkeypatch.setenv("STAND_IN_MANIFEST", " ".join(lacking))
    with pytest.raises(build.BuildError, match="was built but lacks kernel-module-br-netfilter"):
        build.run_build(options_in(tmp_path), environ={})
    out = capsys.readouterr().out
    assert "MISSING  kernel-module-br-netfilter: k3s modprobes it" in out


def test_failed_build_names_the_error_log_and_next_step(tmp_path: Path, stand_ins, fit_host, monkeypatch) -> None:
    stand_ins.add(
        "kas",
        "print('NOTE: Running task 7 of 9 (/x/k3s_git.bb:do_compile)')\n"
        "print('ERROR: k3s-v1.29-r0 do_compile: oe_runmake failed')\n",
        exit_code=1,
    )
    monkeypatch.setattr(build, "kas_executable", lambda: "kas")
    with pytest.raises(build.BuildError) as failure:
        build.run_build(options_in(tmp_path), environ={})
    message = str(failure.value)
    assert "ERROR: k3s-v1.29-r0 do_compile" in message
    assert "kas-build.log" in message and "next step" in message


def test_progress_line_condenses_bitbake_task_counts() -> None:
    progress = process.BitbakeProgress()
    assert not progress.update("NOTE: Fetching layers")
    assert progress.update(
        "NOTE: Running setscene task 12 of 400 (/poky/meta/glibc_2.35.bb:do_populate_sysroot_setscene)"
    )
    assert progress.line() == "[setscene task 12/400   3%] glibc_2.35.bb:do_populate_sysroot_setscene"


def test_logged_run_prints_progress_every_interval_off_a_terminal(tmp_path: Path, stand_ins) -> None:
    stand_ins.add("fakebake", "for n in range(1, 6): print(f'NOTE: Running task {n} of 5 (/r/a.bb:do_x)')")
    out = io.StringIO()
    ticks = iter(range(0, 1000, 20))
    process.run_logged(
        process.Command(["fakebake"]),
        tmp_path / "log",
        out=out,
        progress_every_s=10,
        clock=lambda: next(ticks),
    )
    assert "[task 5/5 100%] a.bb:do_x" in out.getvalue()


def test_host_checks_name_each_problem_and_fix(tmp_path: Path) -> None:
    facts = hostcheck.HostFacts(tmp_path, free_bytes=40 * GIB, euid=0, locales=("C", "POSIX"))
    problems = hostcheck.check_build_host(
        facts, 100, which=lambda tool: None if tool in ("chrpath", "makeinfo") else "/usr/bin/x"
    )
    text = "\n".join(str(p) for p in problems)
    assert "bitbake refuses to build as root" in text
    assert "only 40 GB free" in text and "--min-free-gb" in text
    assert "missing: chrpath, makeinfo" in text and "sudo apt-get install chrpath texinfo" in text
    assert "en_US.UTF-8 locale is not installed" in text and "locale-gen" in text


def test_fit_host_has_no_problems(tmp_path: Path) -> None:
    facts = hostcheck.HostFacts(tmp_path, free_bytes=200 * GIB, euid=1000, locales=("C", "en_US.utf8"))
    assert hostcheck.check_build_host(facts, 100, which=lambda tool: "/usr/bin/" + tool) == []


def test_free_disk_is_measured_on_the_nearest_existing_parent(tmp_path: Path) -> None:
    assert hostcheck.nearest_existing(tmp_path / "not" / "yet") == tmp_path
    assert os.path.isdir(hostcheck.nearest_existing(Path("/definitely/not/here")))


def test_threads_that_kas_would_drop_are_named_before_the_build(tmp_path: Path) -> None:
    (tmp_path / "kas" / "include").mkdir(parents=True)
    top = tmp_path / "kas" / "qemu.yml"
    top.write_text("header:\n  version: 14\n  includes:\n    - kas/include/common.yml\nmachine: qemux86-64\n")
    common = tmp_path / "kas" / "include" / "common.yml"
    common.write_text("header:\n  version: 14\nenv:\n  SOME_OTHER: null\n")
    env = {"BB_NUMBER_THREADS": "8", "PARALLEL_MAKE": "-j 8", "DL_DIR": "/srv/dl"}
    assert build.settings_kas_drops(env, top, tmp_path) == ["BB_NUMBER_THREADS", "PARALLEL_MAKE"]
    common.write_text("header:\n  version: 14\nenv:\n  BB_NUMBER_THREADS: null\n  PARALLEL_MAKE: null\n")
    assert build.settings_kas_drops(env, top, tmp_path) == []
    assert build.settings_kas_drops({"DL_DIR": "/srv/dl"}, tmp_path / "missing.yml", tmp_path) == []


def test_dry_run_warns_when_kas_would_drop_the_threads_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(build, "refuse_unfit_host", lambda o, e: [])
    monkeypatch.setattr(build, "settings_kas_drops", lambda env, kas_file: ["BB_NUMBER_THREADS"])
    build.run_build(options_in(tmp_path, dry_run=True, settings={"BB_NUMBER_THREADS": "8"}), environ={})
    out = capsys.readouterr().out
    assert "warning: BB_NUMBER_THREADS will not reach bitbake" in out and "site.conf" in out


def test_root_refusal_tells_how_to_get_a_clone_of_ones_own_and_the_steps_work(tmp_path: Path) -> None:
    import shlex
    import subprocess

    repo = tmp_path / "root-clone"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "task").write_text("#!/bin/sh\n")
    subprocess.run([*git, "add", "task"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    steps = hostcheck.own_clone_steps(repo, None, bundle=tmp_path / "repo.bundle")
    assert "adduser builder" in steps and "./task build" in steps
    # the git parts of the advice, run as written (minus adduser/su): they give a checkout
    bundle_cmd = steps.split(" && chmod")[0]
    subprocess.run(shlex.split(bundle_cmd), check=True, capture_output=True)
    clone_cmd = steps.split("-c '")[1].split("'")[0].replace("meta-gpu-k8s", str(tmp_path / "mine"))
    subprocess.run(shlex.split(clone_cmd), check=True, capture_output=True)
    assert (tmp_path / "mine" / "task").exists()
    with_origin = hostcheck.own_clone_steps(repo, "https://example.com/meta-gpu-k8s.git")
    assert "bundle" not in with_origin and "git clone https://example.com/meta-gpu-k8s.git" in with_origin
    for local in ("/root/src/meta-gpu-k8s", "file:///srv/git/meta-gpu-k8s.git", "../upstream"):
        # root owns a local origin too: git refuses it to another user ("dubious ownership")
        steps_local = hostcheck.own_clone_steps(repo, local, bundle=tmp_path / "repo.bundle")
        assert "bundle create" in steps_local and f"git clone {local}" not in steps_local, local
    for remote in ("git@github.com:org/meta-gpu-k8s.git", "ssh://git@host/meta-gpu-k8s.git"):
        assert f"git clone {remote}" in hostcheck.own_clone_steps(repo, remote)
    (problem,) = hostcheck.check_not_root(0, repo)
    assert "bitbake refuses" in problem.reason and "git clone" in problem.fix


# ---------------------------------------------------------------- before any build work


def test_an_ab_build_without_signing_keys_stops_before_kas_in_one_line(tmp_path: Path, stand_ins, monkeypatch,
                                                                       capsys) -> None:
    stand_ins.add("kas", KAS_STAND_IN)
    monkeypatch.setattr(build, "kas_executable", lambda: "kas")
    monkeypatch.setattr(hostcheck, "gather_host_facts", lambda path: hostcheck.HostFacts(
        path, free_bytes=500 * GIB, euid=1000, locales=("en_US.utf8",)))
    monkeypatch.setattr(hostcheck, "check_host_tools", lambda which=None: [])
    options = build.BuildOptions(machine="x86-64", build_dir=tmp_path / "x86", accept_nvidia_licence=True)
    with pytest.raises(build.BuildError, match="cannot build yet"):
        build.run_build(options, environ={})
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if "MENDER_ARTIFACT_SIGNING_KEY" in line]
    assert "fix: signed update artifacts are required" in line and "site.conf" in line
    assert stand_ins.calls("kas") == [], "no build work started"
    with pytest.raises(build.BuildError, match="dry run: a real build would stop"):
        build.run_build(dataclass_replace(options, dry_run=True), environ={})
    assert "MENDER_ARTIFACT_SIGNING_KEY and MENDER_ARTIFACT_VERIFY_KEY are not set" in capsys.readouterr().out


def test_the_signing_check_reads_every_kas_file_of_the_argument_not_only_the_first(tmp_path: Path) -> None:
    """--machine jetson-agx-orin is kas/jetson-orin-nano.yml:kas/include/machine-...yml; an
    A/B setting in any part counts (a machine override, a role include, a local.yml)."""
    from tools.image import preflight

    (tmp_path / "top.yml").write_text("header:\n  version: 14\nmachine: m\n")
    (tmp_path / "ab.yml").write_text("header:\n  version: 14\nlocal_conf_header:\n  x: |\n"
                                      "    INHERIT += \"gpu_k8s_mender\"\n")
    argument = preflight.kas_paths("top.yml:ab.yml", root=tmp_path)
    assert preflight.signing_problem(argument[:1], "gpu-k8s-image", {}, tmp_path / "site.conf") == ""
    assert "MENDER_ARTIFACT_SIGNING_KEY" in preflight.signing_problem(argument, "gpu-k8s-image", {},
                                                                      tmp_path / "site.conf")


def test_keys_from_the_environment_or_site_conf_satisfy_the_check(tmp_path: Path) -> None:
    from tools.image import preflight

    pair = write_pair(tmp_path, ec_key())  # made here: the check reads them
    private, public = pair.private, pair.public
    kas = build.REPO_ROOT / "kas/x86-64.yml"
    site = tmp_path / "site.conf"
    assert preflight.signing_problem(kas, "gpu-k8s-image", {}, site)
    keys = {"MENDER_ARTIFACT_SIGNING_KEY": str(private), "MENDER_ARTIFACT_VERIFY_KEY": str(public)}
    assert preflight.signing_problem(kas, "gpu-k8s-image", keys, site) == ""
    site.write_text("".join(f'{name} = "{value}"\n' for name, value in keys.items()))
    assert preflight.signing_problem(kas, "gpu-k8s-image", {}, site) == ""
    assert preflight.signing_problem(kas, "gpu-k8s-image-dev", {}, tmp_path / "none.conf") == "", "debug: optional"


def test_a_kas_failure_for_lack_of_network_names_the_network_and_the_mirror_options(
        tmp_path: Path, stand_ins, fit_host, monkeypatch) -> None:
    stand_ins.add("kas", "print('2026-11-25 10:00:01 - ERROR    - fetch repos failed: error code 128')\n", exit_code=1)
    monkeypatch.setattr(build, "kas_executable", lambda: "kas")
    with pytest.raises(build.BuildError) as failure:
        build.run_build(options_in(tmp_path), environ={})
    first = str(failure.value).splitlines()[0]
    assert "check the network" in first and "KAS_REPO_REF_DIR" in first and "KAS_PREMIRRORS" in first


# ---------------------------------------------------------------- roles


def test_each_role_has_its_kas_include_and_work_dir_and_the_default_role_keeps_the_old_place(tmp_path: Path) -> None:
    def command(machine: str, role: str | None) -> process.Command:
        return build.kas_build_command(build.BuildOptions(machine=machine, role=role), environ={})

    plain = command("jetson-orin-nano", None)
    assert plain.argv[-1] == "kas/jetson-orin-nano.yml"
    assert plain.env["KAS_WORK_DIR"] == str(build.BUILD_ROOT / "jetson-orin-nano")
    assert command("jetson-orin-nano", "server").argv[-1] == "kas/jetson-orin-nano.yml"
    agent = command("jetson-orin-nano", "agent")
    assert agent.argv[-1] == "kas/jetson-orin-nano.yml:kas/include/agent.yml"
    assert agent.env["KAS_WORK_DIR"] == str(build.BUILD_ROOT / "jetson-orin-nano-agent")
    sd_agent = command("jetson-orin-nano-sd", "agent")
    assert sd_agent.argv[-1] == ("kas/jetson-orin-nano.yml:kas/include/machine-jetson-orin-nano-devkit.yml:"
                                 "kas/include/agent.yml")
    nano_server = command("jetson-nano", "server")
    assert nano_server.argv[-1] == "kas/jetson-nano.yml:kas/include/server.yml"
    assert nano_server.env["KAS_WORK_DIR"] == str(build.BUILD_ROOT / "jetson-nano-server")
    assert command("jetson-nano", "agent").env["KAS_WORK_DIR"] == str(build.BUILD_ROOT / "jetson-nano")
    with pytest.raises(build.BuildUsageError, match="--role must be server or agent, got 'master'"):
        command("x86-64", "master")
    for include in build.ROLE_INCLUDES.values():
        assert (build.REPO_ROOT / include).is_file(), include


def test_default_roles_are_the_layers_own(tmp_path: Path) -> None:
    """tools/image/build.py's table says what gpu_k8s_role.bbclass decides, SoC by SoC."""
    import re

    text = (build.REPO_ROOT / "meta-gpu-k8s/classes/gpu_k8s_role.bbclass").read_text()
    defaults = dict(re.findall(r'^GPU_K8S_DEFAULT_K3S_ROLE(?::(\w+))? = "(\w+)"', text, re.M))
    soc = {"jetson-nano-devkit": "tegra210"}  # the only SoC override the class has
    assert set(defaults) - {""} == set(soc.values()), "a new override in the class: add its machines here"
    for name, target in build.MACHINES.items():
        expected = defaults.get(soc.get(target.yocto_machine, ""), defaults[""])
        assert target.default_role == expected, name


def test_a_role_that_is_not_the_default_gets_its_own_device_type_in_its_include() -> None:
    """Release and rollout pick nodes by Mender device type: the other role's image must not
    share the machine's, or an agent artifact would reach its server (docs/fleet.md)."""
    import yaml

    def local_conf(include: str) -> str:
        return "".join((yaml.safe_load((build.REPO_ROOT / include).read_text())["local_conf_header"]).values())

    agent, server = local_conf(build.ROLE_INCLUDES["agent"]), local_conf(build.ROLE_INCLUDES["server"])
    assert 'GPU_K8S_K3S_ROLE = "agent"' in agent and 'GPU_K8S_K3S_ROLE = "server"' in server
    assert 'MENDER_DEVICE_TYPE = "${MACHINE}-agent"' in agent
    assert 'MENDER_DEVICE_TYPE:tegra210 = "${MACHINE}"' in agent, "an agent is the Nano's default: no suffix"
    assert 'MENDER_DEVICE_TYPE:tegra210 = "${MACHINE}-server"' in server
    assert "MENDER_DEVICE_TYPE =" not in server, "a server is every other machine's default: no suffix"


def test_the_licence_is_checked_up_front_for_the_image_that_carries_the_driver(tmp_path: Path, monkeypatch,
                                                                              capsys) -> None:
    monkeypatch.setattr(hostcheck, "gather_host_facts", lambda path: hostcheck.HostFacts(
        path, free_bytes=500 * GIB, euid=1000, locales=("en_US.utf8",)))
    monkeypatch.setattr(hostcheck, "check_host_tools", lambda which=None: [])
    keys = {"GPU_K8S_ARTIFACT_SIGNING": "off"}
    options = build.BuildOptions(machine="x86-64", build_dir=tmp_path / "x86", dry_run=True)
    with pytest.raises(build.BuildError, match="dry run: a real build would stop at the 1 problem"):
        build.run_build(options, environ=keys)
    out = capsys.readouterr().out
    assert "NVIDIA's driver licence is not accepted" in out and "pass --accept-nvidia-licence" in out
    assert "would run: " in out and "kas/x86-64.yml" in out
    build.run_build(dataclass_replace(options, accept_nvidia_licence=True), environ=keys)
    assert "kas/x86-64.yml:kas/include/nvidia-licence.yml" in capsys.readouterr().out
    for machine in ("qemu", "x86-64-scarthgap", "jetson-orin-nano"):  # no NVIDIA driver in these images
        build.run_build(build.BuildOptions(machine=machine, build_dir=tmp_path / machine, dry_run=True), environ=keys)


def test_root_refusal_names_the_build_to_rerun(tmp_path: Path) -> None:
    facts = hostcheck.HostFacts(tmp_path, free_bytes=500 * GIB, euid=0, locales=("en_US.utf8",))
    options = build.BuildOptions(machine="jetson-orin-nano", role="agent")
    (problem,) = hostcheck.check_build_host(facts, 100, which=lambda tool: "/x",
                                            next_step=build.build_command_line(options))
    assert problem.fix.endswith("cd meta-gpu-k8s && ./task build --machine jetson-orin-nano --role agent "
                                "(docs/tooling.md, 'Building as root')")


def test_flash_and_release_find_what_build_made_for_every_machine_and_role(tmp_path: Path) -> None:
    for name, target in build.MACHINES.items():
        for role in build.ROLES:
            options = build.BuildOptions(machine=name, role=role)
            env = build.build_environment(options, {})
            made = build.deploy_dir(options, env)
            assert build.built_deploy_dir(name, role, environ={}) == made, (name, role)
            assert made.name == target.yocto_machine
    work = tmp_path / "big-disk" / "orin"
    options = build.BuildOptions(machine="jetson-orin-nano-sd", build_dir=work)
    made = build.deploy_dir(options, build.build_environment(options, {}))
    assert build.built_deploy_dir("jetson-orin-nano-sd", None, work, environ={}) == made
    (work / "build" / "tmp").mkdir(parents=True)
    # the kas build dir inside it is taken as meant too
    assert build.built_deploy_dir("jetson-orin-nano-sd", None, work / "build", environ={}) == made


def test_build_dir_wins_over_the_environments_work_dir(tmp_path: Path) -> None:
    options = build.BuildOptions(machine="x86-64", build_dir=tmp_path / "mine")
    env = build.build_environment(options, {"KAS_WORK_DIR": "/elsewhere", "KAS_BUILD_DIR": "/elsewhere/build"})
    assert env["KAS_WORK_DIR"] == str(tmp_path / "mine") and env["KAS_BUILD_DIR"] == str(tmp_path / "mine" / "build")
    assert build.build_environment(build.BuildOptions(), {"KAS_WORK_DIR": "/elsewhere"})["KAS_WORK_DIR"] == "/elsewhere"
