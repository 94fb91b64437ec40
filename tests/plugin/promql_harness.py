"""Prometheus itself for tests: promql/ (a small Go program on Prometheus's own packages) loads
scrapes through Prometheus's text parser into its TSDB and evaluates PromQL with its engine.

Built once per source version into build/promql-check/<hash>/ (ignored), with the module
versions go.sum pins (github.com/prometheus/prometheus v0.316.0, i.e. Prometheus 3.x, from the
Go module proxy or the module cache). Where Go or the modules cannot be had, `binary()` says
why and the tests skip with that reason; a program that does not build is a failure.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

SOURCE = Path(__file__).resolve().parent / "promql"
ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 1800  # a cold build compiles Prometheus's TSDB and engine: minutes on a small host


class Target(NamedTuple):
    job: str
    instance: str
    text: str  # the exposition a scrape of it returns


class Series(NamedTuple):
    labels: dict[str, str]
    value: float | None


class Answer(NamedTuple):
    error: str
    series: list[Series]


def _go_env() -> dict[str, str]:
    # never rewrite go.mod/go.sum, never fetch another toolchain, no cgo (no C compiler needed)
    return {**os.environ, "GOFLAGS": "-mod=readonly -buildvcs=false", "GOTOOLCHAIN": "local", "CGO_ENABLED": "0"}


def binary() -> Path | str:
    """The built program, or why it cannot be built here (for a skip)."""
    go = shutil.which("go")
    if go is None:
        return "no Go toolchain (install Go 1.26 or later to run Prometheus's engine on the dashboard)"
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=False).stdout.strip()
    digest = hashlib.sha256(version.encode())
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((SOURCE / name).read_bytes())
    out = ROOT / "build" / "promql-check" / digest.hexdigest()[:16] / "promql-check"
    if out.is_file():
        return out
    fetched = subprocess.run([go, "mod", "download"], cwd=SOURCE, env=_go_env(), capture_output=True, text=True,
                             timeout=BUILD_TIMEOUT_S, check=False)
    if fetched.returncode != 0:
        return ("the Go modules go.sum pins are neither in the module cache nor reachable through GOPROXY: "
                + fetched.stderr.strip()[-400:])
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(f".{os.getpid()}.partial")  # legs that build at once never share a file
    built = subprocess.run([go, "build", "-trimpath", "-o", str(partial), "."], cwd=SOURCE, env=_go_env(),
                           capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    assert built.returncode == 0, f"tests/plugin/promql does not build with {version}:\n{built.stderr}"
    partial.replace(out)  # whole or not at all: another test leg may be looking for it
    return out


def evaluate(program: Path, targets: Sequence[Target], queries: Mapping[str, str], scrapes: int = 21,
             interval_s: int = 15) -> dict[str, Answer]:
    """Every query at the time of the last of `scrapes` scrapes of every target, `interval_s` apart."""
    request = {"targets": [t._asdict() for t in targets], "scrapes": scrapes, "interval_s": interval_s,
               "queries": [{"id": key, "expr": expr} for key, expr in queries.items()]}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(request, handle)
    try:
        done = subprocess.run([str(program), handle.name], capture_output=True, text=True, timeout=600, check=False)
    finally:
        os.unlink(handle.name)
    assert done.returncode == 0, f"Prometheus rejected a scrape or failed:\n{done.stderr}"
    results: list[dict[str, Any]] = json.loads(done.stdout)["results"]
    return {r["id"]: Answer(r.get("error", ""), [Series(s["labels"], s["value"]) for s in r["series"]])
            for r in results}


def label_values(answer: Answer, label: str) -> set[str]:
    """What Grafana's label_values(selector, label) lists, from the selector's answer."""
    return {series.labels[label] for series in answer.series if label in series.labels}


def substitute(expr: str, values: Mapping[str, str], names: Iterable[str]) -> str:
    """Grafana's variables: `$name` becomes the value given, or the All value `.*`."""
    for name in sorted(names, key=len, reverse=True):
        expr = expr.replace(f"${name}", values.get(name, ".*"))
    return expr
