"""The plugin's modules import each other without cycles (function-level imports count too)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "plugin" / "src" / "gpu_device_plugin"
NAME = "gpu_device_plugin"


def module_names() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = [NAME, *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules `module` imports, wherever in the file the import statement is."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in known else base)
    return {name for name in found if name in known and name != module}


def graph() -> dict[str, set[str]]:
    modules = module_names()
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_graph_sees_relative_and_function_level_imports() -> None:
    edges = graph()
    assert "gpu_device_plugin.config.settings" in edges["gpu_device_plugin.cdi.spec"]
    assert "gpu_device_plugin.discovery.nvml" in edges["gpu_device_plugin.discovery.select"]  # lazy import


def test_discovery_and_health_share_one_nvml_helper_module() -> None:
    edges = graph()
    for user in ("gpu_device_plugin.discovery.nvml", "gpu_device_plugin.health.nvml"):
        assert "gpu_device_plugin.discovery.nvml_lib" in edges[user]
    assert "gpu_device_plugin.discovery.nvml" not in edges["gpu_device_plugin.health.nvml"]


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


METRICS = "gpu_device_plugin.metrics"


def test_telemetry_collectors_know_their_hardware_and_nothing_of_prometheus_or_kubernetes() -> None:
    # dcgm-exporter's shape: collectors behind one interface, the Kubernetes step applied after them
    edges = graph()
    outside_a_collector = {f"{METRICS}.{name}" for name in ("exposition", "attribution", "podresources",
                                                             "telemetry", "table")}
    outside_a_collector |= {"gpu_device_plugin.observability.endpoint", "gpu_device_plugin.api.podresources"}
    for collector in (f"{METRICS}.nvml", f"{METRICS}.tegra"):
        assert f"{METRICS}.collector" in edges[collector]
        assert not edges[collector] & outside_a_collector, edges[collector] & outside_a_collector
    for step in (f"{METRICS}.attribution", f"{METRICS}.exposition", f"{METRICS}.podresources"):
        assert not edges[step] & {f"{METRICS}.nvml", f"{METRICS}.tegra"}, step


def test_the_plugin_reads_podresources_with_its_own_wire_code_and_client() -> None:
    edges = graph()
    assert {"gpu_device_plugin.api.grpc_client", "gpu_device_plugin.api.wire",
            "gpu_device_plugin.api.podresources"} <= edges[f"{METRICS}.podresources"]
    assert "gpu_device_plugin.api.pb" not in edges[f"{METRICS}.podresources"]  # pb needs protobuf


def test_only_the_supervision_and_the_cli_reach_into_telemetry() -> None:
    users = {name for name, imported in graph().items() if not name.startswith(METRICS)
             and any(m.startswith(METRICS) for m in imported)}
    assert users == {"gpu_device_plugin.session.supervision", "gpu_device_plugin.cli.main"}
