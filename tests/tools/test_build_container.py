"""build --container: the kas-container command line, what reaches the container, how the
engine is chosen and what is refused before anything runs.

The command line is proved against kas's real kas-container (the version requirements/tools.txt
pins, from the tooling venv) with a stand-in `docker` on PATH that records the `docker run` the
script makes and plays a build into the mounted work dir."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from signing_keys import ec_key, private_pem, public_pem
from test_build_task import FULL_QEMU_MANIFEST

from tools.image import build, container, hostcheck
from tools.paths import REPO_ROOT

GIB = 1024**3

# A docker that answers as docker 28 does, has the kas image, and for `run` plays kas in the
# container: writes the image's artifacts under the host directory mounted at /work.
DOCKER_STAND_IN = """
if argv[:1] == ['-v']:
    print('Docker version 28.2.2, build e6534b4')
elif argv[:2] == ['context', 'show']:
    print('default')
elif argv[:1] == ['run']:
    work = next(v.split(':')[0] for v in argv if v.endswith(':/work:rw'))
    deploy = os.path.join(work, 'build', 'tmp', 'deploy', 'images', 'qemux86-64')
    os.makedirs(deploy, exist_ok=True)
    print('NOTE: Running task 1 of 1 (/work/poky/meta/recipes-core/busybox/busybox.bb:do_compile)')
    with open(os.path.join(deploy, 'gpu-k8s-image-dev-qemux86-64.manifest'), 'w') as manifest:
        manifest.writelines(name + ' core2_64 1.0\\n' for name in env['STAND_IN_MANIFEST'].split())
    with open(os.path.join(deploy, 'gpu-k8s-image-dev-qemux86-64.rootfs.ext4'), 'wb') as rootfs:
        rootfs.write(b'\\0' * 4096)
"""


def answering(*names: str, has_image: bool = True) -> dict[str, container.EngineState]:
    return {name: container.EngineState(name, installed=True, answers=name in names,
                                        error="" if name in names else "Cannot connect to the Docker daemon",
                                        has_image=has_image)
            for name in container.ENGINES}


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch):
    """Set what the engines look like to run_build (default: docker answers, image here)."""
    def use(states: dict[str, container.EngineState]) -> None:
        monkeypatch.setattr(container, "gather_engine_facts", lambda image: states)
    use(answering("docker"))
    monkeypatch.setattr(container, "gather_network_facts", lambda hosts, environ: container.NetworkFacts())
    return use


@pytest.fixture
def fit_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "refuse_unfit_host", lambda options, env: [])


def options_in(tmp_path: Path, **overrides) -> build.BuildOptions:
    return build.BuildOptions(build_dir=tmp_path / "qemu", container=True, **overrides)


def keys(tmp_path: Path) -> dict[str, str]:
    signing, verify = tmp_path / "fleet keys" / "signing.key", tmp_path / "verify.pem"
    signing.parent.mkdir()
    key = ec_key()  # one pair: the build checks them as mender-artifact reads them
    signing.write_bytes(private_pem(key))
    verify.write_bytes(public_pem(key))
    return {"MENDER_ARTIFACT_SIGNING_KEY": str(signing), "MENDER_ARTIFACT_VERIFY_KEY": str(verify)}


# ---------------------------------------------------------------- the command line


def test_dry_run_prints_the_kas_container_command_and_runs_nothing(
    tmp_path: Path, engines, fit_host, stand_ins, capsys: pytest.CaptureFixture[str]
) -> None:
    stand_ins.add("docker", DOCKER_STAND_IN)
    assert build.run_build(options_in(tmp_path, dry_run=True), environ={"DL_DIR": "/srv/dl"}) == []
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "would run:" in line)
    script = container.kas_container_executable()
    assert line.endswith(f"{script} build --target gpu-k8s-image-dev kas/qemu-x86-64.yml"), line
    for setting in ("KAS_CONTAINER_ENGINE=docker", "KAS_CONTAINER_IMAGE_DISTRO=debian-trixie", "DL_DIR=/srv/dl",
                    f"KAS_WORK_DIR={tmp_path / 'qemu'}", f"KAS_BUILD_DIR={tmp_path / 'qemu' / 'build'}"):
        assert f" {setting} " in line, f"{setting} missing from {line}"
    assert "with docker (the first of docker, podman that answers" in out
    assert "kas image ghcr.io/siemens/kas/kas:5.5-debian-trixie: on this host" in out
    assert stand_ins.calls("docker") == [], "a dry run starts no container"
    assert not (tmp_path / "qemu").exists(), "and makes no directory"


def test_the_nanos_kirkstone_build_runs_on_the_debian_its_poky_tested(tmp_path: Path, engines, fit_host) -> None:
    command = build.kas_build_command(build.BuildOptions(machine="jetson-nano", container=True), {}, "podman")
    assert command.env["KAS_CONTAINER_IMAGE_DISTRO"] == "debian-bookworm"
    assert command.env["KAS_CONTAINER_ENGINE"] == "podman"
    assert command.argv[-4:] == ["build", "--target", "gpu-k8s-image", "kas/jetson-nano.yml"]
    own = build.kas_build_command(build.BuildOptions(machine="jetson-nano", container=True),
                                  {"KAS_CONTAINER_IMAGE_DISTRO": "debian-trixie"}, "podman")
    assert "KAS_CONTAINER_IMAGE_DISTRO" not in own.env, "the user's own choice stays the user's"
    assert container.kas_image("5.5", "kirkstone", {}) == "ghcr.io/siemens/kas/kas:5.5-debian-bookworm"
    assert container.kas_image("5.5", "wrynose", {"KAS_CONTAINER_IMAGE": "registry.lan/kas:5.5"}) == \
        "registry.lan/kas:5.5"


def test_the_kas_container_version_is_the_pinned_kas() -> None:
    pinned = next(line.split("==")[1] for line in (REPO_ROOT / "requirements/tools.txt").read_text().splitlines()
                  if line.startswith("kas=="))
    assert container.script_version(container.kas_container_executable()) == pinned


def test_real_kas_container_mounts_the_caches_and_carries_version_and_keys_into_the_container(
    tmp_path: Path, engines, fit_host, stand_ins, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    stand_ins.add("docker", DOCKER_STAND_IN)
    monkeypatch.setenv("STAND_IN_MANIFEST", " ".join(FULL_QEMU_MANIFEST))
    if os.geteuid() == 0:  # only so the script builds its command line here (build itself refuses root)
        monkeypatch.setenv("KAS_ALLOW_ROOT", "yes")
    for name in ("KAS_CONTAINER_ENGINE", "KAS_CONTAINER_IMAGE", "KAS_CONTAINER_IMAGE_DISTRO", "TMPDIR"):
        monkeypatch.delenv(name, raising=False)
    downloads, sstate = tmp_path / "downloads", tmp_path / "sstate"
    environ = {"GPU_K8S_VERSION": "1.4.0", "DL_DIR": str(downloads), "SSTATE_DIR": str(sstate),
               "BB_NUMBER_THREADS": "6", **keys(tmp_path)}
    with pytest.raises(build.BuildError, match="cannot build yet"):
        build.run_build(options_in(tmp_path), environ=environ)
    assert "signing.key' holds a space" in capsys.readouterr().out, "kas-container would split that path"
    assert stand_ins.calls("docker") == [] or all(c["argv"][:1] != ["run"] for c in stand_ins.calls("docker"))
    signing = tmp_path / "signing.key"
    (tmp_path / "fleet keys" / "signing.key").rename(signing)
    environ["MENDER_ARTIFACT_SIGNING_KEY"] = str(signing)

    artifacts = build.run_build(options_in(tmp_path), environ=environ)

    assert {a.path.name for a in artifacts} == {"gpu-k8s-image-dev-qemux86-64.manifest",
                                                "gpu-k8s-image-dev-qemux86-64.rootfs.ext4"}
    run = next(call["argv"] for call in stand_ins.calls("docker") if call["argv"][:1] == ["run"])
    text = " ".join(run)
    work = tmp_path / "qemu"
    assert f"-v {REPO_ROOT}:/repo:ro" in text, "the repository, read-only"
    assert f"-v {work}:/work:rw -e KAS_WORK_DIR=/work" in text
    assert "-e KAS_BUILD_DIR=/work/build" in text, "the build dir inside the work dir"
    assert f"-v {downloads}:/downloads:rw -e DL_DIR=/downloads" in text
    assert f"-v {sstate}:/sstate:rw -e SSTATE_DIR=/sstate" in text
    assert "-e BB_NUMBER_THREADS=6" in text
    assert "-e GPU_K8S_VERSION=1.4.0" in text, "the release version, which kas-container leaves outside"
    assert (f"-v {signing}:/run/gpu-k8s-keys/mender-artifact-signing-key.pem:ro "
            "-e MENDER_ARTIFACT_SIGNING_KEY=/run/gpu-k8s-keys/mender-artifact-signing-key.pem") in text
    assert "-e MENDER_ARTIFACT_VERIFY_KEY=/run/gpu-k8s-keys/mender-artifact-verify-key.pem" in text
    assert run[-5:] == ["ghcr.io/siemens/kas/kas:5.5-debian-trixie", "build", "--target", "gpu-k8s-image-dev",
                        "/repo/kas/qemu-x86-64.yml"]
    assert downloads.is_dir() and sstate.is_dir(), "kas-container makes the caches it mounts"
    assert "built gpu-k8s-image-dev for qemu" in capsys.readouterr().out


# ---------------------------------------------------------------- choosing the engine


def test_docker_is_taken_first_when_it_answers_and_podman_when_docker_does_not() -> None:
    first = container.choose_engine(None, "", answering("docker", "podman"))
    assert first.engine == "docker" and not first.problems
    fallback = container.choose_engine(None, "", answering("podman"))
    assert fallback.engine == "podman"
    assert "docker does not answer: Cannot connect to the Docker daemon" in fallback.why


def test_podmans_docker_shim_is_not_taken_for_docker() -> None:
    states = answering("docker", "podman")
    states["docker"] = container.EngineState("docker", installed=True, genuine=False, answers=True)
    assert container.choose_engine(None, "", states).engine == "podman"


def test_the_engine_asked_for_must_be_there_and_answer() -> None:
    states = answering("docker")
    states["podman"] = container.EngineState("podman")
    missing = container.choose_engine("podman", "--engine", states)
    assert missing.engine is None
    assert "--engine asks for podman, which is not installed" in str(missing.problems[0])
    assert "sudo apt-get install podman" in missing.problems[0].fix
    down = container.choose_engine("docker", "KAS_CONTAINER_ENGINE", answering("podman"))
    assert "KAS_CONTAINER_ENGINE asks for docker, which does not answer" in str(down.problems[0])
    assert "sudo systemctl start docker" in down.problems[0].fix and "--engine podman" in down.problems[0].fix


def test_no_engine_at_all_names_how_to_get_one() -> None:
    nothing = {name: container.EngineState(name) for name in container.ENGINES}
    (problem,) = container.choose_engine(None, "", nothing).problems
    assert "no container engine: --container needs docker or podman" in problem.reason
    assert "apt-get install podman" in problem.fix


def test_a_user_outside_the_docker_group_is_told_to_join_it() -> None:
    states = {"docker": container.EngineState("docker", installed=True, error="permission denied while trying to "
                                              "connect to the docker API at unix:///var/run/docker.sock"),
              "podman": container.EngineState("podman")}
    (problem,) = container.choose_engine(None, "", states).problems
    assert "usermod -aG docker $USER" in problem.fix


def test_engine_facts_are_read_from_the_engines_themselves(tmp_path: Path, stand_ins) -> None:
    stand_ins.add("docker", "if argv[:1] == ['-v']: print('Docker version 28.2.2, build e6534b4')\n"
                  "if argv[:1] == ['info']: sys.stderr.write('Cannot connect to the Docker daemon at "
                  "unix:///var/run/docker.sock. Is the docker daemon running?\\n'); sys.exit(1)\n")
    stand_ins.add("podman", "if argv[:2] == ['image', 'inspect']: sys.exit(1)\n")
    only_stand_ins = lambda name: container.shutil.which(name, path=str(stand_ins.bin_dir))  # noqa: E731
    states = container.gather_engine_facts("ghcr.io/siemens/kas/kas:5.5", which=only_stand_ins)
    assert states["docker"].installed and states["docker"].genuine and not states["docker"].answers
    assert states["docker"].error.startswith("Cannot connect to the Docker daemon")
    assert states["podman"].answers and not states["podman"].has_image
    assert ["image", "inspect", "ghcr.io/siemens/kas/kas:5.5"] in [c["argv"] for c in stand_ins.calls("podman")]
    assert not any(c["argv"][:2] == ["image", "inspect"] for c in stand_ins.calls("docker")), \
        "a daemon that does not answer is not asked for images"


# ---------------------------------------------------------------- refusals


def test_root_is_refused_for_the_container_too_with_the_way_out(tmp_path: Path) -> None:
    (problem,) = hostcheck.check_not_root_for_container(0, repo_root=tmp_path)
    assert "kas-container refuses root" in problem.reason and "Do not use Bitbake as root" in problem.reason
    assert "adduser builder" in problem.fix and "usermod -aG docker builder" in problem.fix
    assert "./task build --container" in problem.fix
    assert hostcheck.check_not_root_for_container(1000, repo_root=tmp_path) == []


def test_a_container_build_does_not_ask_for_yocto_host_packages_or_the_locale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts = hostcheck.HostFacts(tmp_path, free_bytes=40 * GIB, euid=1000, locales=("C",))
    monkeypatch.setattr(hostcheck, "gather_host_facts", lambda build_dir: facts)
    real_check = hostcheck.check_host_tools
    monkeypatch.setattr(hostcheck, "check_host_tools", lambda which: real_check(lambda tool: None))  # no tool at all
    options = options_in(tmp_path)
    problems = build.refuse_unfit_host(options, build.build_environment(options, {}))
    assert [p.reason for p in problems] == [f"only 40 GB free under {tmp_path}; a full image build needs about 100 GB"]
    native = build.refuse_unfit_host(build.BuildOptions(build_dir=tmp_path / "qemu"),
                                     build.build_environment(options, {}))
    assert any("host tools that bitbake needs are missing" in p.reason for p in native)


def test_no_engine_refuses_the_build_before_any_container_starts(
    tmp_path: Path, engines, fit_host, stand_ins
) -> None:
    engines({name: container.EngineState(name) for name in container.ENGINES})
    with pytest.raises(build.BuildError, match="this host cannot build yet"):
        build.run_build(options_in(tmp_path), environ={})
    with pytest.raises(build.BuildError, match="dry run: a real build would stop at the 1 problem"):
        build.run_build(options_in(tmp_path, dry_run=True), environ={})


def test_settings_the_container_cannot_take_are_refused(tmp_path: Path) -> None:
    env = {"KAS_WORK_DIR": "/srv/my builds/qemu", "DL_DIR": "/srv/dl"}
    problems = container.environment_problems(env, {"TMPDIR": "/fast/tmp"})
    text = "\n".join(str(p) for p in problems)
    assert "TMPDIR is set, but kas-container does not pass it into the container" in text
    assert "KAS_WORK_DIR '/srv/my builds/qemu' holds a space" in text
    assert container.environment_problems({"DL_DIR": "/srv/dl"}, {}) == []


def test_keys_bitbake_takes_from_site_conf_are_refused_for_the_container(tmp_path: Path) -> None:
    """site.conf's `=` wins over the environment in bitbake (preflight.release_settings), so a key
    it names is a host path inside the container even when the environment names one too; its
    `?=` yields to the environment."""
    site_conf = tmp_path / "site.conf"
    site_conf.write_text('MENDER_ARTIFACT_SIGNING_KEY = "/home/me/keys/signing.key"\n')
    kas_files = [REPO_ROOT / "kas/x86-64.yml"]
    for env in ({}, {"MENDER_ARTIFACT_SIGNING_KEY": "/k"}):
        problem = container.site_conf_keys_problem(kas_files, env, site_conf)
        assert f"MENDER_ARTIFACT_SIGNING_KEY come from {site_conf}" in problem and "export" in problem
    site_conf.write_text('MENDER_ARTIFACT_SIGNING_KEY ?= "/home/me/keys/signing.key"\n')
    assert container.site_conf_keys_problem(kas_files, {"MENDER_ARTIFACT_SIGNING_KEY": "/k"}, site_conf) == ""
    assert "come from" in container.site_conf_keys_problem(kas_files, {}, site_conf)


def test_an_offline_host_without_the_kas_image_is_refused_naming_the_hosts(tmp_path: Path) -> None:
    repos = container.layer_repositories([REPO_ROOT / "kas/jetson-nano.yml"])
    assert repos["meta-tegra"] == "https://github.com/OE4T/meta-tegra.git"
    image = "ghcr.io/siemens/kas/kas:5.5-debian-bookworm"
    hosts = container.hosts_to_reach(image, False, repos, tmp_path, {})
    assert hosts == ("ghcr.io", "git.openembedded.org", "git.yoctoproject.org", "github.com")
    network = container.gather_network_facts(hosts, {}, resolves=lambda host: host == "github.com")
    problems = [str(p) for p in container.network_problems(image, False, network)]
    assert "ghcr.io does not resolve" in problems[0] and "docker load -i kas.tar" in problems[0]
    assert "git.openembedded.org, git.yoctoproject.org, which do not resolve" in problems[1]
    assert "--repo-ref-dir" in problems[1]


def test_what_needs_no_network_is_not_asked_about(tmp_path: Path) -> None:
    repos = {"meta-tegra": "https://github.com/OE4T/meta-tegra.git", "bitbake": "https://git.openembedded.org/bitbake"}
    (tmp_path / "bitbake" / ".git").mkdir(parents=True)  # checked out by an earlier build
    assert container.hosts_to_reach("ghcr.io/siemens/kas/kas:5.5", True, repos, tmp_path, {}) == ("github.com",)
    assert container.hosts_to_reach("ghcr.io/siemens/kas/kas:5.5", True, repos, tmp_path,
                                    {"KAS_REPO_REF_DIR": "/srv/ref"}) == ()
    proxied = container.gather_network_facts(["github.com"], {"https_proxy": "http://proxy:3128"},
                                             resolves=lambda host: False)
    assert proxied.unresolved == () and proxied.proxy == "http://proxy:3128"


def test_values_kas_container_would_split_are_refused_not_mangled() -> None:
    runtime = container.runtime_arguments({"GPU_K8S_VERSION", "PARALLEL_MAKE"},
                                          {"GPU_K8S_VERSION": "1.4.0 rc1", "PARALLEL_MAKE": "-j 8"})
    assert runtime.args == (), "PARALLEL_MAKE is kas-container's own to pass"
    assert "GPU_K8S_VERSION='1.4.0 rc1' holds a space" in str(runtime.problems[0])


# ---------------------------------------------------------------- the command line of ./task


def task(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO_ROOT), *argv],
                          capture_output=True, text=True, check=False, env=env)


def test_task_build_container_dry_run_prints_the_kas_container_command(tmp_path: Path, stand_ins) -> None:
    """The issue's check, through ./task's own command line: whatever this host lacks, the exact
    kas-container command is printed, and the exit status says whether a real build would start."""
    stand_ins.add("docker", DOCKER_STAND_IN)
    env = {name: value for name, value in os.environ.items()
           if name not in ("TMPDIR", "KAS_CONTAINER_ENGINE", "KAS_DOCKER_ENGINE", "KAS_WORK_DIR", "KAS_BUILD_DIR")}
    env.update(GPU_K8S_BUILD_ROOT=str(tmp_path / "build"), https_proxy="http://proxy.invalid:3128")
    done = task("build", "--container", "--dry-run", "--min-free-gb", "0", env=env)
    assert "kas-container build --target gpu-k8s-image-dev kas/qemu-x86-64.yml" in done.stdout, done.stdout
    assert "KAS_CONTAINER_ENGINE=docker" in done.stdout
    assert done.returncode == (1 if os.geteuid() == 0 else 0), done.stdout + done.stderr


@pytest.mark.parametrize(("argv", "message"), [
    (("build", "--container", "--engine", "lxc", "--dry-run"), "error: --engine must be docker or podman, got 'lxc'"),
    (("build", "--engine", "podman", "--dry-run"),
     "error: --engine podman chooses the container engine of --container: add --container, or leave --engine out"),
])
def test_engine_mistakes_are_one_line_usage_errors(argv: tuple[str, ...], message: str) -> None:
    done = task(*argv)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [message]
