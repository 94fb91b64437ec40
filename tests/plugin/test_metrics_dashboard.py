"""deploy/grafana/gpu-k8s-fleet.json against what the exporters serve.

Statically: it asks only for dcgm-exporter's metric names and labels (as the plugin writes
them) and the plugin's own series, and is templated by node, GPU model, GPU, namespace and
pod. Then for real: the plugin's /metrics of an NVML node (an H100 and a time-sliced T4),
a Nano, an Orin (time-sliced) and a Thor, made by the plugin's own code from the fake NVML
and the fixture trees, are scraped into Prometheus (its text parser, TSDB and PromQL engine:
promql_harness), and every variable and panel query runs filtered to each node in turn: each
returns that node's GPUs wherever the node exports what the query reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_nvml import FakeGpu, FakeNvml, make_gpus
from gpu_device_plugin.discovery.nvml import NvmlBackend
from gpu_device_plugin.metrics import fields
from gpu_device_plugin.metrics.attribution import Holder
from gpu_device_plugin.metrics.nvml import NvmlCollector
from gpu_device_plugin.metrics.tegra import TegraCollector
from gpu_device_plugin.metrics.telemetry import Telemetry
from gpu_device_plugin.observability.endpoint import metrics_body, render_metrics
from promql_harness import Answer, Target, binary, evaluate, label_values, substitute
from telemetry_trees import NANO, ORIN, THOR, jetson_gpu
from test_observability import SERVING

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gpu-k8s-fleet.json"
# the labels our series carry (metrics/exposition.py, endpoint.py) and the ones Prometheus adds to every target
OUR_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", fields.DRIVER_VERSION,
              "pod", "namespace", "container", "vgpu", "err_code", "err_msg", "resource", "health", "instance", "job"}
VARIABLES = ["datasource", "Hostname", "modelName", "UUID", "namespace", "pod"]
# a metric every collector exports (NVML's memory info, a Jetson's /proc/meminfo): GPUs and nodes are counted on it
KEY = fields.FB_USED


def board() -> dict:
    return json.loads(DASHBOARD.read_text())


def panel_queries() -> dict[str, str]:
    """"<panel title> #<n>" -> its n-th target's expression."""
    return {f"{p['title']} #{i}": t["expr"] for p in board()["panels"] for i, t in enumerate(p.get("targets", ()))}


def variable_queries() -> dict[str, str]:
    return {v["name"]: v["definition"] for v in board()["templating"]["list"] if v.get("definition")}


def expressions() -> list[str]:
    legends = [t["legendFormat"] for p in board()["panels"] for t in p.get("targets", ())]
    return [*panel_queries().values(), *variable_queries().values(), *legends]


def test_every_metric_the_dashboard_reads_is_one_we_export() -> None:
    ours = {f.name for f in fields.METRICS} | set(re.findall(r"^# TYPE (\S+)", render_metrics(SERVING), re.M))
    ours |= {"gpu_device_plugin_pod_gpu_share", "gpu_device_plugin_pod_resources_up",
             "gpu_device_plugin_pod_labels_age_seconds"}
    used = {name for expr in expressions() for name in re.findall(r"\b(DCGM_[A-Z_]+|gpu_device_plugin_\w+)", expr)}
    assert used and used <= ours, used - ours
    # the core of any GPU dashboard, on NVML GPUs and Jetsons alike
    assert {fields.GPU_UTIL, fields.GPU_TEMP, fields.SM_CLOCK, fields.FB_USED, fields.XID_ERRORS} <= used


def test_every_label_the_dashboard_groups_filters_or_joins_by_is_one_we_write() -> None:
    used: set[str] = set()
    for expr in expressions():
        for group in re.findall(r"\b(?:by|on) \(([^)]*)\)", expr):
            used |= {label.strip() for label in group.split(",")}
        used |= set(re.findall(r"[{,]\s*([A-Za-z_]\w*)\s*[!=]~?\"", expr))
        used |= set(re.findall(r"label_values\([^,]+,\s*(\w+)\)", expr))
        used |= set(re.findall(r"\{\{(\w+)\}\}", expr))
    assert used and used <= OUR_LABELS, used - OUR_LABELS
    assert {"Hostname", "modelName", "UUID", "pod", "namespace", "container", "err_msg"} <= used


def test_the_dashboard_is_templated_by_node_gpu_pod_and_namespace_keyed_on_what_every_gpu_exports() -> None:
    variables = {v["name"]: v for v in board()["templating"]["list"]}
    assert list(variables) == VARIABLES
    # node, model and GPU come from the metric every collector exports, never from one some GPUs lack
    for name in ("Hostname", "modelName", "UUID"):
        assert variables[name]["definition"].startswith(f"label_values({KEY}"), name
    # pods and namespaces from the plugin's shares: every GPU kind a pod holds has them
    for name in ("namespace", "pod"):
        assert variables[name]["definition"].startswith("label_values(gpu_device_plugin_pod_gpu_share"), name
    for expr in panel_queries().values():
        assert "DCGM_FI_DEV_SM_CLOCK{" not in expr or "SM clock" in str(expr) or "* 1000000" in expr
        for selector in re.findall(r"\b(?:DCGM_\w+|gpu_device_plugin_pod_gpu_share)\{([^}]*)\}", expr):
            assert 'Hostname=~"$Hostname"' in selector and 'UUID=~"$UUID"' in selector, expr
        for selector in re.findall(r"\bgpu_device_plugin_(?!pod_gpu_share)\w+\{([^}]*)\}", expr):
            assert 'Hostname=~"$Hostname"' in selector, expr  # the plugin's health follows the node filter
        if "gpu_device_plugin_pod_gpu_share{" in expr:
            assert 'namespace=~"$namespace",pod=~"$pod"' in expr, expr


def test_the_dashboard_is_well_formed_for_grafana() -> None:
    data = board()
    ids = [p["id"] for p in data["panels"]]
    assert len(ids) == len(set(ids))
    for panel in data["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
    for expr in expressions():
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr


# ---------------------------------------------------------------- the queries in Prometheus


NODES = {"nvml": "dgx-1", "nano": "nano-1", "orin": "orin-1", "thor": "thor-1"}
HOLDERS = {  # GPU -> containers holding it, per node: whole GPUs and time-sliced ones
    "nvml": lambda gpus: {gpus[0].id: [Holder("train-0", "ml", "main")],
                          gpus[1].id: [Holder("a", "ml", "c", "0"), Holder("b", "web", "c", "1")]},
    "nano": lambda gpus: {gpus[0].id: [Holder("infer-0", "vision", "model")]},
    "orin": lambda gpus: {gpus[0].id: [Holder("cam-0", "vision", "c", "0"), Holder("cam-0", "vision", "c", "1"),
                                       Holder("cam-1", "vision", "c", "2")]},
    "thor": lambda gpus: {gpus[0].id: [Holder("llm-0", "ai", "serve")]},
}


def node_scrape(kind: str, collector: object, gpus: list, advance: object = None) -> Target:
    node = NODES[kind]
    holders = HOLDERS[kind](gpus)
    telemetry = Telemetry(lambda: [collector], [g.id for g in gpus], None, node=node, max_age=0, wait=30,
                          read_holders=lambda: holders)
    if advance is not None:  # NVML's between-scrapes fields need a scrape before
        telemetry.render()
        advance()
    status = SERVING._replace(node=node, healthy_devices=len(gpus))
    return Target("gpu-device-plugin", f"{node}:9402", metrics_body(status, telemetry))


def xid(gpu_id: str) -> int:
    return 13  # every GPU had one: the Xid panels have a row per GPU


@pytest.fixture(scope="module")
def targets() -> Iterator[dict[str, Target]]:
    h100, t4 = make_gpus(2)
    h100.name, h100.gpu_util, h100.power_mw, h100.energy_mj = "NVIDIA H100 80GB HBM3", 71, 402000, 10**9
    h100.gpm_rates, h100.nvlink_kib_per_s = {1: 80.0, 5: 45.0, 10: 60.0, 20: 900.0, 21: 700.0}, (4096.0, 4096.0)
    t4.name, t4.gpu_util, t4.memory_used_mib = "Tesla T4", 33, 2468
    nvml = FakeNvml([h100, t4], driver_version="580.126.20")
    dgpus = NvmlBackend(nvml_module=nvml).discover()
    out = {"nvml": node_scrape("nvml", NvmlCollector(dgpus, nvml, xid), dgpus, lambda: nvml.advance(15))}
    no_nvml = FakeNvml(library_missing=True)
    for kind, root in (("nano", NANO), ("orin", ORIN)):
        gpu = jetson_gpu(root)
        out[kind] = node_scrape(kind, TegraCollector([gpu], str(root), xid, no_nvml), [gpu])
    thor = jetson_gpu(THOR)
    thor_nvml = FakeNvml([FakeGpu(uuid=thor.properties["uuid"], name="NVIDIA Thor", gpu_util=12)])
    out["thor"] = node_scrape("thor", TegraCollector([thor], str(THOR), xid, thor_nvml), [thor])
    yield out


@pytest.fixture(scope="module")
def prometheus() -> Path:
    program = binary()
    if isinstance(program, str):
        pytest.skip(program)
    return program


def has_all(text: str, expr: str) -> bool:
    """Whether a scrape has every metric the expression reads."""
    names = set(re.findall(r"\b(DCGM_[A-Z_]+|gpu_device_plugin_\w+)", expr))
    return all(re.search(rf"^{name}[{{ ]", text, re.M) for name in names)


def selector(definition: str) -> str:
    return re.fullmatch(r"label_values\((.*),\s*\w+\)", definition).group(1)  # type: ignore[union-attr]


def test_every_query_returns_every_gpu_kind_filtered_to_its_node_in_prometheus(
        prometheus: Path, targets: dict[str, Target]) -> None:
    names = VARIABLES[1:]
    queries: dict[str, str] = {}
    for kind, node in NODES.items():
        for key, expr in panel_queries().items():
            queries[f"{kind}|{key}"] = substitute(expr, {"Hostname": node}, names)
        for name, definition in variable_queries().items():
            queries[f"{kind}|${name}"] = substitute(selector(definition), {"Hostname": node}, names)
    answers = evaluate(prometheus, list(targets.values()), queries)
    expected_empty = []
    for key, answer in answers.items():
        kind, query = key.split("|", 1)
        assert not answer.error, (key, answer.error)
        expr = variable_queries()[query[1:]] if query.startswith("$") else panel_queries()[query]
        exported = has_all(targets[kind].text, expr) or "or vector(0)" in expr
        if not exported:  # e.g. power on the Orin, PROF fields on Jetsons: nothing to show, nothing made up
            expected_empty.append(key)
            assert not answer.series, (key, answer.series)
            continue
        assert answer.series, f"{query} returns nothing for the {kind} node although it exports what it reads"
        hosts = {s.labels.get("Hostname") for s in answer.series} - {None}
        # the node filter holds, the plugin's own series included
        assert query == "$Hostname" or hosts <= {NODES[kind]}, (key, hosts)
    # the checks above are not vacuous: the key queries answer for every kind, and Jetsons lack only what they lack
    for kind in NODES:
        for query in ("GPUs reporting #0", "Nodes #0", "GPUs held by pods #0", "$Hostname", "$UUID", "$namespace",
                      "$pod", "Device plugin: devices by health #0", "GPU memory attributed to namespaces #0",
                      "Last Xid per GPU #0", "Pod labels: the kubelet's answers #0", "GPU utilization #0"):
            assert f"{kind}|{query}" not in expected_empty, (kind, query)
    assert "orin|Power draw #0" in expected_empty and "nano|Tensor and graphics engine activity #0" in expected_empty


def test_all_nodes_count_every_gpu_and_list_every_pod_in_prometheus(
        prometheus: Path, targets: dict[str, Target]) -> None:
    names = VARIABLES[1:]
    queries = {key: substitute(expr, {}, names) for key, expr in panel_queries().items()}
    queries |= {f"${name}": substitute(selector(d), {}, names) for name, d in variable_queries().items()}
    queries["pod a"] = substitute(panel_queries()["GPUs held by pods #0"], {"pod": "a"}, names)
    queries["namespace web"] = substitute(panel_queries()["GPU memory attributed to namespaces #0"],
                                          {"namespace": "web"}, names)
    answers = evaluate(prometheus, list(targets.values()), queries)
    assert not [key for key, answer in answers.items() if answer.error]

    def value(answer: Answer) -> float | None:
        [series] = answer.series
        return series.value

    assert value(answers["GPUs reporting #0"]) == 5 and value(answers["Nodes #0"]) == 4
    assert label_values(answers["$Hostname"], "Hostname") == set(NODES.values())
    assert label_values(answers["$modelName"], "modelName") == {
        "NVIDIA H100 80GB HBM3", "Tesla T4", "Tegra X1 (T210)", "Orin (T234)", "Thor (T264)"}
    assert len(label_values(answers["$UUID"], "UUID")) == 5
    assert label_values(answers["$namespace"], "namespace") == {"ml", "web", "vision", "ai"}
    assert label_values(answers["$pod"], "pod") == {"train-0", "a", "b", "infer-0", "cam-0", "cam-1", "llm-0"}
    held = sorted((s.labels["Hostname"], s.labels["pod"], s.labels.get("vgpu", ""), s.value)
                  for s in answers["GPUs held by pods #0"].series)
    assert held == [("dgx-1", "a", "0", 0.5), ("dgx-1", "b", "1", 0.5), ("dgx-1", "train-0", "", 1.0),
                    ("nano-1", "infer-0", "", 1.0), ("orin-1", "cam-0", "0", pytest.approx(1 / 3)),
                    ("orin-1", "cam-0", "1", pytest.approx(1 / 3)), ("orin-1", "cam-1", "2", pytest.approx(1 / 3)),
                    ("thor-1", "llm-0", "", 1.0)]
    assert {s.labels["pod"] for s in answers["pod a"].series} == {"a"}
    # the T4's 2468 MiB are split between its two pods, not counted once per pod
    assert [(s.labels["namespace"], s.value) for s in answers["namespace web"].series] == [("web", 1234)]
    xids = answers["Last Xid per GPU #0"].series
    assert len(xids) == 5 and {s.labels["err_msg"] for s in xids} == {"Graphics Engine Exception"}


def test_sums_over_pods_are_true_for_every_field_in_prometheus(prometheus: Path, targets: dict[str, Target]) -> None:
    """For each DCGM field: one series per GPU, and what its pods are attributed (field x share, as the
    dashboard computes it) adds up to at most the GPU's value."""
    queries = {}
    for field in fields.METRICS:
        name = field.name
        share = "gpu_device_plugin_pod_gpu_share"
        attributed = f"sum by (Hostname, UUID) ({name} * on (Hostname, UUID) group_right {share})"
        queries[f"{name} copies"] = f"count by (Hostname, UUID) ({name}) > 1"
        queries[f"{name} over"] = f"{attributed} > on (Hostname, UUID) (sum by (Hostname, UUID) ({name}) * 1.000001)"
        queries[f"{name} attributed"] = attributed
    answers = evaluate(prometheus, list(targets.values()), queries)
    exported = [f.name for f in fields.METRICS if any(has_all(t.text, f.name) for t in targets.values())]
    assert len(exported) >= 20, exported  # the check covers nearly every field, PROF and NVLink included
    for name in exported:
        for what in ("copies", "over", "attributed"):
            assert not answers[f"{name} {what}"].error, (name, what, answers[f"{name} {what}"].error)
        assert not answers[f"{name} copies"].series, (name, answers[f"{name} copies"].series)
        assert not answers[f"{name} over"].series, (name, answers[f"{name} over"].series)
        assert answers[f"{name} attributed"].series, name  # held GPUs have it: the comparison is not vacuous
