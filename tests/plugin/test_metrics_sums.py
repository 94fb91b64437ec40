"""Sums that are true: a GPU is counted once in any sum over its series, and what is attributed to
pods on a time-sliced GPU adds up to at most the GPU's whole, for every field we export.

Checked on the Prometheus text itself (parsed back), for whole GPUs, time-sliced GPUs shared by
several containers, one container holding several replicas, and holders from two sources (the
device plugin's devices and, as a DRA driver will add, claims)."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest
from gpu_device_plugin.metrics import fields
from gpu_device_plugin.metrics.attribution import Holder, attribute, merge, per_pod
from gpu_device_plugin.metrics.collector import GpuLabels, GpuSample
from gpu_device_plugin.metrics.exposition import SHARE, render

LINE = re.compile(r'^(\w+)\{(.*)\} (\S+)$')
PAIR = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def gpu(index: int, uuid: str) -> GpuSample:
    """A GPU with a value for every field we export (distinct, so a wrong join shows)."""
    labels = GpuLabels(gpu=str(index), uuid=uuid, device=f"nvidia{index}", model_name="m", driver_version="1")
    return GpuSample(labels, {field.name: 100.0 * (index + 1) + number
                              for number, field in enumerate(fields.METRICS, 1)})


SLICED, WHOLE, IDLE = gpu(0, "GPU-sliced"), gpu(1, "GPU-whole"), gpu(2, "GPU-idle")
CASES = {
    "three pods on one time-sliced GPU": {"GPU-sliced": [Holder("a", "ml", "c", "0"), Holder("b", "ml", "c", "1"),
                                                         Holder("c", "web", "c", "2")],
                                          "GPU-whole": [Holder("t", "ml", "main")]},
    "one container with two replicas beside another": {"GPU-sliced": [Holder("a", "ml", "c", "0"),
                                                                      Holder("a", "ml", "c", "3"),
                                                                      Holder("b", "ml", "c", "1")]},
    "one container holding every held replica": {"GPU-sliced": [Holder("a", "ml", "c", "0"),
                                                                Holder("a", "ml", "c", "1")]},
    "devices and claims merged": merge({"GPU-sliced": [Holder("a", "ml", "c", "0")]},
                                       {"GPU-sliced": [Holder("d", "ml", "c", extra=(("claim", "gpu-claim"),))]}),
}


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = LINE.match(line)
        assert match, line
        out.append((match.group(1), dict(PAIR.findall(match.group(2))), float(match.group(3))))
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_every_field_has_one_series_per_gpu_and_pods_get_at_most_its_whole(case: str) -> None:
    holders = CASES[case]
    series = parse(render(attribute([SLICED, WHOLE, IDLE], holders), "node-1"))
    whole: dict[tuple[str, str], float] = {}
    named_pods: dict[tuple[str, str], list[float]] = defaultdict(list)
    shares: dict[str, dict[tuple[str, str], float]] = defaultdict(lambda: defaultdict(float))
    for name, labels, value in series:
        if name == SHARE:
            shares[labels["UUID"]][(labels["namespace"], labels["pod"])] += value
            continue
        key = (name, labels["UUID"])
        assert key not in whole, f"{name} has two series for {labels['UUID']}: sums over it count the GPU twice"
        whole[key] = value
        if "pod" in labels:
            named_pods[key].append(value)
    for sample in (SLICED, WHOLE, IDLE):
        uuid = sample.labels.uuid
        assert sum(shares[uuid].values()) <= 1 + 1e-9, (uuid, shares[uuid])
        for field in fields.METRICS:
            total = whole[(field.name, uuid)]
            assert total == sample.values[field.name], field.name  # per-GPU series stay whole
            attributed = sum(total * share for share in shares[uuid].values())
            assert attributed <= total + 1e-9, (field.name, uuid, attributed, total)
            assert sum(named_pods[(field.name, uuid)]) <= total, (field.name, uuid)
    assert not shares["GPU-idle"] and not named_pods.get((fields.GPU_UTIL, "GPU-idle"))


def test_a_time_sliced_gpu_shared_by_three_pods_names_none_and_splits_evenly() -> None:
    [sliced, whole] = attribute([SLICED, WHOLE], CASES["three pods on one time-sliced GPU"])
    assert sliced.owner is None and whole.owner == Holder("t", "ml", "main")
    split = per_pod(sliced, fields.FB_USED)
    assert [(h.pod, round(v, 6)) for h, v in split] == [(p, round(SLICED.values[fields.FB_USED] / 3, 6))
                                                         for p in "abc"]
    assert per_pod(whole, fields.POWER_USAGE) == [(Holder("t", "ml", "main"), WHOLE.values[fields.POWER_USAGE])]

