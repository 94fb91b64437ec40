"""The `test` leg that runs conformance/: our plugin and DRA harness against Kubernetes' own Go code.

Go builds the harness from the module proxy (k8s.io/kubernetes at the version conformance/go.mod
pins) with its module and build caches under build/go/, so only the first run downloads and
compiles. Where Go is missing or older than go.mod asks, the leg is skipped and says so.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tools import console
from tools.paths import BUILD_ROOT, REPO_ROOT

MODULE_DIR = REPO_ROOT / "conformance"
GO_CACHE_ROOT = BUILD_ROOT / "go"
TEST_TIMEOUT = "40m"  # go test's own limit per package; the leg reports how long it took


def go_mod_versions(go_mod: str) -> tuple[tuple[int, ...], str]:
    """(the go line as numbers, the k8s.io/kubernetes version) of conformance/go.mod's text."""
    go_line = re.search(r"^go (\d+(?:\.\d+)*)\s*$", go_mod, re.M)
    kubernetes = re.search(r"^\s*(?:require\s+)?k8s\.io/kubernetes (v\S+)", go_mod, re.M)
    if not go_line or not kubernetes:
        raise ValueError("conformance/go.mod names no go version or no k8s.io/kubernetes")
    return tuple(int(p) for p in go_line.group(1).split(".")), kubernetes.group(1)


def parse_go_version(text: str) -> tuple[int, ...] | None:
    """`go1.26.8` (go env GOVERSION) -> (1, 26, 8); None for anything else."""
    match = re.fullmatch(r"go(\d+(?:\.\d+)*)\S*", text.strip())
    return tuple(int(p) for p in match.group(1).split(".")) if match else None


def go_env(cache_root: Path = GO_CACHE_ROOT) -> dict[str, str]:
    """The environment the leg runs go in: caches under build/go (kept between runs, writable so
    that deleting build/ works), no toolchain switch behind our back."""
    flags = os.environ.get("GOFLAGS", "")
    if "-modcacherw" not in flags.split():
        flags = f"{flags} -modcacherw".strip()
    return {"GOMODCACHE": str(cache_root / "mod"), "GOCACHE": str(cache_root / "cache"),
            "GOTOOLCHAIN": "local", "GOFLAGS": flags}


@dataclass
class TestTally:
    """What go test -json reported, test by test (subtests included)."""

    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed_packages: list[str] = field(default_factory=list)
    output: dict[str, list[str]] = field(default_factory=dict)

    def add(self, event: dict) -> str | None:
        """Takes one event; returns a line worth printing now, if any."""
        action, package, test = event.get("Action"), event.get("Package", ""), event.get("Test")
        key = f"{package.rsplit('/', 1)[-1]}.{test}" if test else package
        if action == "output":
            self.output.setdefault(key, []).append(event.get("Output", ""))
            return None
        if action == "build-output":
            return event.get("Output", "").rstrip("\n") or None
        if test is None:
            if action == "fail":
                self.failed_packages.append(package)
                return f"FAIL {package}"
            return f"ok   {package} ({event.get('Elapsed', 0):.0f} s)" if action == "pass" else None
        seconds = f"{event.get('Elapsed', 0):.1f} s"
        if action == "pass":
            self.passed.append(key)
            return f"  pass {key} ({seconds})"
        if action == "skip":
            self.skipped.append(key)
            return f"  skip {key}"
        if action == "fail":
            self.failed.append(key)
            return f"  FAIL {key} ({seconds})\n" + "".join(self.output.get(key, [])).rstrip()
        return None

    def verdict(self) -> tuple[str, str]:
        counts = f"{len(self.passed)} passed, {len(self.failed)} failed, {len(self.skipped)} skipped"
        if self.failed:
            return "FAIL", counts
        if self.failed_packages:  # a build error or a panic outside any test
            return "FAIL", f"{counts}; failing packages: {', '.join(self.failed_packages)}"
        if not self.passed:
            return "NO TESTS", counts
        return "pass", counts


def tally(lines: Iterable[str], show: Callable[[str], None]) -> TestTally:
    result = TestTally()
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            show(line.rstrip("\n"))  # go's own messages (a download, a build error outside -json)
            continue
        printable = result.add(event)
        if printable:
            show(printable)
    return result


def run_go(argv: list[str], env: dict[str, str]) -> int:
    console.info("running: " + " ".join(argv))
    return subprocess.run(argv, cwd=MODULE_DIR, env={**os.environ, **env}, check=False).returncode


def leg(plugin_python: Callable[[], Path]) -> tuple[str, str]:
    """Download, build the benchmark's programs, then build and run every package's tests (a
    package that does not build fails with the compiler's messages); plugin_python makes (once)
    and names the interpreter our plugin runs on in the harness (the image's stack)."""
    go = shutil.which("go")
    wanted, kubernetes = go_mod_versions((MODULE_DIR / "go.mod").read_text())
    need = ".".join(map(str, wanted))
    if go is None:
        return "skipped", (f"Go is not installed, so the Kubernetes {kubernetes} conformance harness did not run; "
                           f"fix: install Go >= {need} (the leg then downloads its modules itself)")
    have_text = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False).stdout
    have = parse_go_version(have_text)
    if have is None or have < wanted:
        return "skipped", (f"{have_text.strip() or go} is older than the go {need} conformance/go.mod needs, so the "
                           f"Kubernetes {kubernetes} harness did not run; fix: install Go >= {need}")
    env = {**go_env(), "GPU_PLUGIN_PYTHON": str(plugin_python()), "CONFORMANCE_REPO": str(REPO_ROOT)}
    started = time.monotonic()
    if run_go([go, "mod", "download"], env) != 0:
        return "FAIL", "go mod download failed (the module proxy unreachable? GOPROXY, GOFLAGS=-mod=mod)"
    downloaded = time.monotonic()
    # the benchmark's programs first: they compile the kubelet's device manager the tests link too
    if run_go([str(REPO_ROOT / "bench" / "go" / "build.sh")], env) != 0:
        return "FAIL", "bench/go/build.sh failed (see its messages above)"
    built = time.monotonic()
    argv = [go, "test", "-count=1", "-json", f"-timeout={TEST_TIMEOUT}", "./..."]
    console.info("running: " + " ".join(argv))
    with subprocess.Popen(argv, cwd=MODULE_DIR, env={**os.environ, **env}, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        result = tally(proc.stdout, console.info)
    status, detail = result.verdict()
    if proc.returncode != 0 and status == "pass":
        status, detail = "FAIL", f"go test exit {proc.returncode}; {detail}"
    # go test links each test binary anew: the compile of what the tests add is in their time
    timings = (f"modules {downloaded - started:.0f} s, benchmark programs {built - downloaded:.0f} s, "
               f"tests with their compile {time.monotonic() - built:.0f} s")
    return status, f"k8s.io/kubernetes {kubernetes}; {detail}; {timings}"
