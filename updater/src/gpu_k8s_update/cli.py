"""Command line: gpu-k8s-update gate | upgrade | status | report | forget | wait-plan."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Sequence

from gpu_k8s_update import __version__, decide, gate, logs, plans, publish, settings, upgrade
from gpu_k8s_update.exits import EXIT_USAGE
from gpu_k8s_update.node import Node
from gpu_k8s_update.system import SystemStateError

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-k8s-update",
        description="Node side of fleet OS updates: install a Mender artifact, gate it on a healthy "
        "GPU node, commit or roll back. Every setting also reads GPU_K8S_UPDATE_<NAME> from the "
        "environment (/etc/default/gpu-k8s-update for the gate's unit).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--state-dir", help="where the marker and the gate's verdict live, on the data "
                        "partition (default /data/gpu-k8s-update)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    gate_parser = commands.add_parser("gate", help="judge a pending update after its first boot: commit or roll back")
    gate_parser.add_argument("--timeout", type=float, dest="gate_timeout_s",
                             help="seconds the node has to become healthy (default 900)")
    gate_parser.add_argument("--poll-interval", type=float, dest="poll_interval_s",
                             help="seconds between health probes (default 10)")
    gate_parser.add_argument("--unreachable-grace", type=float, dest="unreachable_grace_s",
                             help="seconds the API server may be unreachable before local checks alone pass "
                             "(default 300)")
    gate_parser.add_argument("--gpu", choices=["yes", "no", "auto"],
                             help="require the device plugin and an allocatable nvidia.com/gpu (default auto: "
                             "if the node had one before the update)")

    upgrade_parser = commands.add_parser("upgrade", help="bring this node to a release (idempotent; the rollout "
                                         "job runs it)")
    upgrade_parser.add_argument("--version", required=True, dest="target_version",
                                help="release version; the image's artifact_name is it or ends with -VERSION")
    source = upgrade_parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--artifact-url",
                        help="http(s) URL of the .mender artifact, or an absolute path (USB stick)")
    source.add_argument("--artifact", action="append", metavar="DEVICE_TYPE=URL",
                        help="an artifact for one Mender device type (repeat for more): the node installs the one "
                        "for its own device type (/var/lib/mender/device_type) and refuses, exit 8, when none fits")
    upgrade_parser.add_argument("--wait-for-gate", type=float, dest="wait_for_gate_s",
                                help="seconds to wait for the health gate on the new slot (default 1200)")

    status_parser = commands.add_parser("status", help="print what the agent sees and would do, as JSON")
    status_parser.add_argument("--version", dest="target_version", help="also show the step toward this version")

    report_parser = commands.add_parser("report", help="publish what the data partition check found since the last "
                                        "update (update.gpu-k8s.io/data) on this node's Node, retrying until the API "
                                        "server takes it (gpu-k8s-update-report.service, after k3s starts)")
    report_parser.add_argument("--timeout", type=float, default=600.0, dest="report_timeout_s",
                               help="seconds to keep trying (default 600); exit 1 if it was not taken by then")
    commands.add_parser("forget", help="drop the marker, so a version that rolled back here may be tried again")

    wait_parser = commands.add_parser("wait-plan", help="block until system-upgrade-controller Plans completed a "
                                      "version (the agent rings' prepare step)")
    wait_parser.add_argument("--plan", required=True, action="append", dest="plans",
                             help="name of a Plan to wait for (the server ring's, the canary ring's); repeat to wait "
                             "for each in turn")
    wait_parser.add_argument("--namespace", default="system-upgrade", help="its namespace (default system-upgrade)")
    wait_parser.add_argument("--version", required=True, dest="target_version", help="the version it must complete")
    wait_parser.add_argument("--poll-interval", type=float, default=15.0, dest="plan_poll_s",
                             help="seconds between looks at the Plan (default 15)")
    return parser


def misplaced_version(argv: Sequence[str]) -> str:
    """`gpu-k8s-update --version 1.4.0 upgrade ...` would print the agent's own version and
    do nothing: a release version belongs after the command."""
    if len(argv) > 1 and argv[0] == "--version":
        return (f"--version before the command prints this program's version; a release version goes after the "
                f"command: gpu-k8s-update {' '.join(argv[2:]) or 'upgrade'} --version {argv[1]}")
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    problem = misplaced_version(args)
    if problem:
        print(f"gpu-k8s-update: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    arguments = build_parser().parse_args(args)
    logs.setup(arguments.log_level)
    flags = {name: getattr(arguments, name, None) for name in (
        "state_dir", "gate_timeout_s", "poll_interval_s", "unreachable_grace_s", "gpu", "wait_for_gate_s")}
    try:
        config = settings.load(os.environ, flags)
    except settings.SettingsError as error:
        log.error("%s", error)
        return EXIT_USAGE
    node = Node.from_settings(config)
    if arguments.command == "gate":
        return gate.run_gate(node)
    if arguments.command == "upgrade":
        if arguments.artifact:
            return upgrade.run_upgrade_for_device(node, arguments.target_version, arguments.artifact)
        return upgrade.run_upgrade(node, arguments.target_version, arguments.artifact_url)
    if arguments.command == "status":
        return _status(node, arguments.target_version)
    if arguments.command == "wait-plan":
        return _wait_plan(arguments)
    if arguments.command == "report":
        return _report(node, arguments.report_timeout_s)
    return _forget(node)


def _report(node: Node, timeout_s: float) -> int:
    """At every start of k3s: a repair or a /data made again reaches the fleet view then, not
    only at the node's next update step. Best effort, like every publish: it decides nothing."""
    started = node.host.monotonic()
    while True:
        done, detail = node.publish_data()
        if done:
            log.info("report: %s", detail)
            return 0
        if node.host.monotonic() - started >= timeout_s:
            log.warning("report: not published within %.0fs: %s", timeout_s, detail)
            return 1
        log.debug("report: not yet: %s", detail)
        node.host.sleep(node.settings.poll_interval_s)


def _wait_plan(arguments: argparse.Namespace) -> int:
    try:
        fetchers = [(name, plans.fetch_plan_from_api(os.environ, arguments.namespace, name))
                    for name in arguments.plans]
    except ValueError as error:
        log.error("%s", error)
        return plans.EXIT_USAGE
    for name, fetch in fetchers:
        plans.wait_for_plan(fetch, arguments.target_version, name, time.sleep, arguments.plan_poll_s)
    return plans.EXIT_OK


def _status(node: Node, version: str | None) -> int:
    report: dict[str, object] = {"backend": node.ab.name}
    problem = node.ab.check()
    if problem:
        report["error"] = problem
    try:
        report["booted_version"] = node.ab.booted_version()
        state = node.ab.pending()
        report["pending"] = state.pending
        report["boot_state"] = {name: value for name, value in dataclasses.asdict(state).items() if value}
        report["slots"] = node.ab.slots()
        report["boot_id"] = node.host.boot_id()
    except SystemStateError as error:
        report.setdefault("error", str(error))
    report["node_name"] = {"name": node.node_name, "from": node.node_name_source}
    marker = node.store.load_marker()
    report["marker"] = marker.to_json() if marker else None
    report["last_gate"] = node.store.load_gate_result()
    if version and "error" not in report:
        facts = upgrade.observe(node, version)
        decision = decide.plan_upgrade(facts, node.settings.max_install_attempts)
        report["next_step"] = {"step": decision.step.value, "reason": decision.reason}
    data = node.data_report()
    report["data"] = {"state": data.state, "time": data.time, "detail": data.detail,
                      "annotation": data.annotation}
    report["recent_events"] = node.store.recent_events()
    json.dump(report, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0 if "error" not in report else 1


def _forget(node: Node) -> int:
    marker = node.store.load_marker()
    if marker is None:
        log.info("no marker in %s: nothing to forget", node.settings.state_dir)
        return 0
    node.store.clear_marker()
    node.store.record("forget", version=marker.version, phase=marker.phase.value)
    log.info("forgot the %s marker for %s: the next rollout may try it again", marker.phase.value, marker.version)
    try:
        running = node.ab.booted_version()
    except SystemStateError:
        running = "?"
    node.publish_state(publish.COMMITTED, running, f"{marker.version} forgotten by hand (was {marker.phase.value}); "
                       f"running {running}")
    return 0
