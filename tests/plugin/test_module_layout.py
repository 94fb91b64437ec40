"""The package's folders are the design's parts (plugin/README.md, "The layout") and the imports
between them keep to the design: the policy core does no I/O; discovery backends know
nothing of gRPC or the kubelet; the wire knows nothing of GPUs; only the command line starts
a session. Every folder with modules is a package the build ships."""

from __future__ import annotations

import ast
import configparser
import importlib
from collections.abc import Mapping
from pathlib import Path

import pytest
from test_import_graph import NAME, PACKAGE, graph

PLUGIN = PACKAGE.parents[1]

# What each part may import besides itself: a folder (every module in it) or one module.
# `__init__` is the package's own (its __version__). A new import across parts fails here
# until this table says the design allows it; change plugin/README.md's layout with it.
MAY_IMPORT: Mapping[str, frozenset[str]] = {
    # plain values and the OS, below everything
    "model": frozenset(),
    "host": frozenset(),
    "__init__": frozenset(),
    # the wire, HTTP/2 and gRPC: messages and frames, nothing of GPUs or the session
    "api": frozenset(),
    # logs, sd_notify, counters, the /healthz and /metrics endpoint: handed what they show
    "observability": frozenset(),
    "config": frozenset({"cdi.names"}),  # a CDI kind is checked by CDI's naming rules
    "cdi": frozenset({"model", "config.settings", "host"}),
    # the policy core: decisions without I/O, on plain values
    "core": frozenset({"model", "config.settings", "cdi.names"}),
    # each backend knows its hardware and nothing of gRPC, the kubelet or the policy
    "discovery": frozenset({"model", "config.settings"}),
    "health": frozenset({"model", "discovery", "host"}),
    # the thin servicer: protobuf to the core and back
    "service": frozenset({"model", "api", "core", "config.settings", "cdi", "host", "observability.logs"}),
    # telemetry: collectors per source, the kubelet's PodResources through our own client
    "metrics": frozenset({"model", "api", "config.settings", "core.policy", "discovery", "observability.node"}),
    "doctor": frozenset({"model", "config", "core", "discovery", "health", "cdi"}),
    # the kubelet session drives the service, the core, CDI, reload and what systemd sees
    "session": frozenset({"__init__", "model", "api", "config.settings", "config.reload_policy", "core", "cdi",
                          "health.base", "host", "observability", "service", "metrics.telemetry"}),
    "cli": frozenset({"__init__", "model", "config", "core", "discovery", "health", "observability", "session",
                      "doctor", "metrics"}),
    "__main__": frozenset({"cli"}),
}

# Modules that reach the OS; the policy core imports none of them and opens no file.
OS_MODULES = frozenset({"os", "io", "socket", "select", "selectors", "subprocess", "ctypes", "glob", "shutil",
                        "tempfile", "pathlib", "mmap", "signal", "fcntl", "urllib", "http", "socketserver"})


def part_of(module: str) -> str:
    """`gpu_device_plugin.session.kubelet` -> `session`; the package itself -> `__init__`."""
    rest = module[len(NAME) + 1:] if module != NAME else ""
    return rest.split(".")[0] if rest else "__init__"


def allowed(target: str, rules: frozenset[str]) -> bool:
    inner = target[len(NAME) + 1:] if target != NAME else "__init__"
    return any(inner == rule or inner.startswith(rule + ".") for rule in rules)


def layout_violations(edges: Mapping[str, set[str]], rules: Mapping[str, frozenset[str]]) -> list[str]:
    found = []
    for module, imported in sorted(edges.items()):
        part = part_of(module)
        for target in sorted(imported):
            if part_of(target) != part and not allowed(target, rules.get(part, frozenset())):
                found.append(f"{module} imports {target}: {part}/ may import only "
                             f"{', '.join(sorted(rules.get(part, ()))) or 'nothing of the plugin'}")
    return found


def folders_with_modules() -> set[str]:
    return {".".join((NAME, *d.relative_to(PACKAGE).parts)) if d != PACKAGE else NAME
            for d in [PACKAGE, *PACKAGE.rglob("*")]
            if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))}


def test_every_folder_is_a_part_the_layout_names() -> None:
    parts = {part_of(folder) for folder in folders_with_modules() if folder != NAME}
    root_modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert parts - set(MAY_IMPORT) == set(), "a new folder: add it to MAY_IMPORT and plugin/README.md's layout"
    assert root_modules == {"__init__", "__main__", "model"}, \
        "a module at the package root: put it in the folder of the part it serves"


def test_the_parts_import_only_what_the_design_allows() -> None:
    assert layout_violations(graph(), MAY_IMPORT) == []


def test_the_layout_check_finds_a_forbidden_import() -> None:
    edges = {f"{NAME}.core.policy": {f"{NAME}.config.settings", f"{NAME}.host.paths"},
             f"{NAME}.api.wire": {f"{NAME}.discovery.base"},
             f"{NAME}.discovery.tegra": {f"{NAME}.discovery.base", f"{NAME}.model"}}
    assert layout_violations(edges, MAY_IMPORT) == [
        f"{NAME}.api.wire imports {NAME}.discovery.base: api/ may import only nothing of the plugin",
        f"{NAME}.core.policy imports {NAME}.host.paths: core/ may import only cdi.names, config.settings, model",
    ]


def test_the_policy_core_does_no_io() -> None:
    for path in sorted((PACKAGE / "core").glob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and not node.level}
        opened = [node.lineno for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open"]
        assert imported & OS_MODULES == set(), f"core/{path.name} imports {sorted(imported & OS_MODULES)}"
        assert opened == [], f"core/{path.name} opens a file at line {opened[0]}"


def test_only_the_command_line_starts_a_session() -> None:
    users = {module for module, imported in graph().items()
             if part_of(module) != "session" and any(part_of(m) == "session" for m in imported)}
    assert users == {f"{NAME}.cli.serve"}


def test_no_two_classes_share_a_name_and_one_module_is_the_policy() -> None:
    modules = [p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts]
    classes: dict[str, list[str]] = {}
    for module in modules:
        for node in ast.parse(module.read_text()).body:
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append(str(module.relative_to(PACKAGE)))
    assert {name: where for name, where in classes.items() if len(where) > 1} == {}
    assert [str(p.relative_to(PACKAGE)) for p in modules if p.stem == "policy"] == ["core/policy.py"]


# ---------------------------------------------------------------- what the build ships


def setup_cfg() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(PLUGIN / "setup.cfg")
    return parser


def test_every_folder_with_modules_is_a_package_the_build_ships(monkeypatch: pytest.MonkeyPatch) -> None:
    # setuptools' own reading of setup.cfg, `packages = find:` expanded as a build expands it: a
    # folder without __init__.py, or left out of an explicit list, would be missing from the image
    from setuptools.config.setupcfg import read_configuration

    monkeypatch.chdir(PLUGIN)
    shipped = set(read_configuration("setup.cfg")["options"]["packages"])
    assert folders_with_modules() - shipped == set()
    assert {f"{NAME}.session", f"{NAME}.core", f"{NAME}.api"} <= shipped


def test_the_console_script_names_a_function_that_exists() -> None:
    scripts = [line.split("=", 1) for line in setup_cfg()["options.entry_points"]["console_scripts"].splitlines()
               if line.strip()]
    assert [name.strip() for name, _ in scripts] == ["gpu-device-plugin"]
    module, _, function = scripts[0][1].strip().partition(":")
    assert callable(getattr(importlib.import_module(module), function))


def test_the_package_dir_is_where_the_tests_read_the_sources() -> None:
    assert setup_cfg()["options"]["package_dir"].split() == ["=", "src"]
    assert Path(importlib.import_module(NAME).__file__).parent == PACKAGE
