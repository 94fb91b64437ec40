"""bench/kubelet_bench.py's own arithmetic and parsing, without Go or a plugin."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "kubelet_bench.py"


@pytest.fixture(scope="module")
def kb():
    spec = importlib.util.spec_from_file_location("kubelet_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["kubelet_bench"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("kubelet_bench", None)


def sample(kb, target: str, p50: float, idle: float = 0.0, start: float = 10.0):
    return kb.Sample(target, start, start / 2, p50 * 2, p50, p50 * 3, p50 / 2, 20.0, 15.0, idle, 1.0)


def test_percentiles_are_observed_values_by_nearest_rank(kb) -> None:
    values = [float(v) for v in range(1, 101)]
    assert kb.percentile(values, 0.5) == 51.0  # rank round(0.5 * 99) = 50 (zero-based)
    assert kb.percentile(values, 0.99) == 99.0
    assert kb.percentile([7.0], 0.99) == 7.0
    with pytest.raises(ValueError):
        kb.percentile([], 0.5)


def test_admission_timings_become_microsecond_percentiles(kb) -> None:
    events = kb.parse_events(['{"event": "listening"}', "", '{"event": "admissions", "ns": [1000, 3000, 2000]}'])
    assert [e["event"] for e in events] == ["listening", "admissions"]
    assert kb.admission_figures(events[1]) == (2.0, 3.0)


@pytest.mark.parametrize("line", ["panic: runtime error", "[1, 2]", '{"no": "event"}'])
def test_a_line_the_client_should_not_print_is_an_error_naming_it(kb, line: str) -> None:
    with pytest.raises(kb.BenchError, match="kubelet-client printed"):
        kb.parse_events([line])


def test_timings_must_be_there(kb) -> None:
    with pytest.raises(kb.BenchError, match="expected admission timings"):
        kb.admission_figures({"event": "admissions", "ns": []})


def test_medians_are_per_target_and_ratios_against_the_reference(kb) -> None:
    samples = [sample(kb, "go-reference", p) for p in (200, 220, 900)]
    samples += [sample(kb, "simulated", p, idle=0.02) for p in (300, 330, 310)]
    summary = kb.medians(samples)
    assert summary["go-reference"]["p50_us"] == 220
    assert summary["simulated"]["p50_us"] == 310
    rows = kb.table(summary)
    assert rows[0].split() == ["figure", "(median)", "go-reference", "simulated", "simulated/ref"]
    p50 = next(r for r in rows if r.startswith("admission p50"))
    assert p50.split()[-3:] == ["220", "310", "1.41x"]
    idle = next(r for r in rows if r.startswith("idle CPU"))
    assert idle.split()[-1] == "-", "no ratio against a reference that used no CPU"


def test_a_table_without_the_reference_has_no_ratio_columns(kb) -> None:
    rows = kb.table(kb.medians([sample(kb, "tegra", 300)]))
    assert rows[0].split() == ["figure", "(median)", "tegra"]


def test_other_plugins_are_named_commands(kb) -> None:
    target = kb.extra_target("other=/usr/bin/p --kubelet-socket {socket_dir}/kubelet.sock")
    assert (target.name, target.argv[0]) == ("other", "/usr/bin/p")
    for bad in ("other", "=cmd", "simulated=cmd"):
        with pytest.raises(kb.BenchError, match="NAME=COMMAND"):
            kb.extra_target(bad)


def test_without_the_go_programs_it_says_how_to_build_them(kb, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(kb, "GO_BIN", tmp_path)
    assert kb.main(["--rounds", "1"]) == 2
    assert "bench/go/build.sh" in capsys.readouterr().err


def test_targets_take_turns_and_each_leads_equally_often(kb) -> None:
    order = kb.slice_order(["go", "simulated", "tegra"], 6)
    assert order[:3] == [["go", "simulated", "tegra"], ["simulated", "tegra", "go"], ["tegra", "go", "simulated"]]
    assert all(sorted(s) == ["go", "simulated", "tegra"] for s in order)
    assert [s[0] for s in order].count("tegra") == 2


@pytest.mark.parametrize("flag", ["--slices", "--admissions", "--rounds"])
def test_counts_below_one_are_refused_before_anything_starts(kb, flag, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        kb.main([flag, "0"])
    assert exit_info.value.code == 2
    assert "1 or more" in capsys.readouterr().err
