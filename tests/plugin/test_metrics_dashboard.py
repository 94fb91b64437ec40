"""deploy/grafana/gpu-k8s-fleet.json asks only for what the exporters serve: dcgm-exporter's
metric names and labels (as the plugin writes them) and the plugin's own gauges."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gpu_device_plugin.metrics import fields
from gpu_device_plugin.observability.endpoint import render_metrics
from test_observability import SERVING

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gpu-k8s-fleet.json"
# the labels our series carry (metrics/exposition.py) and the one Prometheus adds to every target
OUR_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", fields.DRIVER_VERSION,
              "pod", "namespace", "container", "vgpu", "err_code", "resource", "health", "instance"}


def expressions() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t[key] for p in board["panels"] for t in p.get("targets", ()) for key in ("expr", "legendFormat")]
    exprs += [v["definition"] for v in board["templating"]["list"] if v.get("definition")]
    return exprs


def test_every_metric_the_dashboard_reads_is_one_we_export() -> None:
    ours = {f.name for f in fields.METRICS} | set(re.findall(r"^# TYPE (\S+)", render_metrics(SERVING), re.M))
    used = {name for expr in expressions() for name in re.findall(r"\b(DCGM_[A-Z_]+|gpu_device_plugin_\w+)", expr)}
    assert used and used <= ours, used - ours
    # the core of any GPU dashboard, on NVML GPUs and Jetsons alike
    assert {fields.GPU_UTIL, fields.GPU_TEMP, fields.SM_CLOCK, fields.FB_USED, fields.XID_ERRORS} <= used


def test_every_label_the_dashboard_groups_or_filters_by_is_one_we_write() -> None:
    used: set[str] = set()
    for expr in expressions():
        for group in re.findall(r"\bby \(([^)]*)\)", expr):
            used |= {label.strip() for label in group.split(",")}
        used |= set(re.findall(r"[{,]\s*([A-Za-z_]\w*)\s*[!=]~?\"", expr))
        used |= set(re.findall(r"label_values\([^,]+,\s*(\w+)\)", expr))
        used |= set(re.findall(r"\{\{(\w+)\}\}", expr))
    assert used and used <= OUR_LABELS, used - OUR_LABELS
    assert {"Hostname", "modelName", "pod", "namespace", "container"} <= used


def test_the_dashboard_is_well_formed_for_grafana() -> None:
    board = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource", "Hostname", "modelName"]
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
    for expr in expressions():
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr
