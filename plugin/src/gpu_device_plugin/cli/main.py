"""`gpu-device-plugin`: serve (default), `dra` (the DRA driver), `discover` (what is here and why),
`check` (the node doctor), `metrics` (the GPU metrics /metrics serves, for a person), `node-labels`
(a k3s drop-in labelling the node with its GPU), `runtime-config` (are the NVIDIA runtime's settings
in force: the unit docker and k3s require on Jetson runs it), `version`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .. import __version__
from ..config import loader
from ..config.settings import ConfigError, Settings
from ..core import policy
from ..discovery.base import DiscoveryError
from ..discovery.select import Choice, choose
from ..model import Gpu
from ..observability import logs

log = logging.getLogger("gpu_device_plugin")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def add_config_arguments(parser: argparse.ArgumentParser, default: Any = None) -> None:
    """Flags default to None so we can tell 'not given' from a value.

    Subcommand parsers pass default=argparse.SUPPRESS so a flag given before the subcommand
    is not overwritten by the subcommand's own default.
    """
    parser.add_argument("--config-file", metavar="PATH", default=default,
                        help="YAML config file (official plugin's v1 format) [env CONFIG_FILE]")
    for option in loader.OPTIONS:
        extra: dict[str, Any] = {"nargs": "?", "const": "true"} if option.is_switch else {}
        parser.add_argument(option.flag, dest=option.attr, metavar=option.metavar or None, default=default,
                            help=f"{option.help} [env {option.env}]", **extra)


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser for this command line. A subcommand's copy of the config flags is added only
    when its name is on the line: argparse can reach a subcommand only through its name, and
    five unused copies of ~25 flags were a tenth of the plugin's start (what the unit runs
    names no subcommand)."""
    named = set(argv)
    common: list[argparse.ArgumentParser] = []
    if named & {"serve", "dra", "discover", "check", "metrics", "node-labels"}:
        common.append(argparse.ArgumentParser(add_help=False))
        add_config_arguments(common[0], default=argparse.SUPPRESS)

    def parents(command: str) -> list[argparse.ArgumentParser]:
        return common if command in named else []

    parser = argparse.ArgumentParser(
        prog="gpu-device-plugin",
        description="Kubernetes device plugin for NVIDIA GPUs (Jetson/Tegra, NVML, simulated). "
                    "Without a command it serves nvidia.com/gpu to the kubelet.",
    )
    add_config_arguments(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("serve", parents=parents("serve"), help="serve GPUs to the kubelet (default)")
    dra = sub.add_parser("dra", parents=parents("dra"),
                         help="run the DRA driver: ResourceSlices for this node's GPUs, a CDI device per claim")
    if "dra" in named:  # its flags only when it is named, like the config flags
        from .dra import add_arguments

        add_arguments(dra)
    discover = sub.add_parser("discover", parents=parents("discover"),
                              help="show which GPUs discovery finds here, and why")
    discover.add_argument("--json", action="store_true", help="machine-readable output")
    sub.add_parser("check", parents=parents("check"),
                   help="is this node set up for GPU pods? (discovery, device nodes, runtime, k3s, kubelet)")
    metrics = sub.add_parser("metrics", parents=parents("metrics"),
                             help="print the GPU metrics /metrics serves (dcgm-exporter's names), read now")
    metrics.add_argument("--prometheus", action="store_true", help="print them as Prometheus text")
    labels = sub.add_parser("node-labels", parents=parents("node-labels"),
                            help="write a k3s config drop-in labelling this node with the GPU discovery finds "
                                 "(removed when there is none)")
    labels.add_argument("--output", metavar="PATH", required=True,
                        help="the drop-in to write, e.g. /etc/rancher/k3s/config.yaml.d/50-gpu-labels.yaml")
    runtime = sub.add_parser("runtime-config",
                             help="exit 0 only when the NVIDIA runtime's config.toml has every --expect setting in "
                                  "force, as the runtime reads it (merged over the toolkit's defaults)")
    runtime.add_argument("--expect", metavar="KEY=VALUE", action="append", required=True,
                         help="a setting as nvidia-ctk config --set takes it, e.g. "
                              "accept-nvidia-visible-devices-envvar-when-unprivileged=false (repeatable)")
    runtime.add_argument("--root", metavar="PATH", default="/", help="the host's / (for tests and containers)")
    sub.add_parser("version", help="print the version")
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    return build_parser(argv).parse_args(argv)


def load_settings(namespace: argparse.Namespace) -> tuple[Settings, tuple[str, ...]]:
    return loader.load(namespace, os.environ, _read)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.command == "version":
        print(__version__)
        return 0
    if args.command == "runtime-config":  # before the plugin's own settings: it needs none of them
        from ..doctor.runtime import runtime_settings_command

        return runtime_settings_command(args.expect, args.root)
    try:
        settings, warnings = load_settings(args)
    except ConfigError as exc:
        print(f"gpu-device-plugin: {exc}", file=sys.stderr)
        if args.command != "check":
            return 2
        # still check the node; the config-file check explains the error in context
        settings, warnings = Settings(config_file=args.config_file or os.environ.get("CONFIG_FILE", "")), ()
    if args.command == "check":
        from ..doctor.report import exit_code, format_report
        from ..doctor.run import run_checks

        checks = run_checks(settings)

        def report() -> int:
            print(format_report(checks))
            return exit_code(checks)

        return _to_a_reader(report)
    logs.setup(settings.log_level)
    for warning in warnings:
        log.warning("%s", warning)
    if args.command == "discover":
        return _to_a_reader(lambda: discover_command(settings, as_json=args.json))
    if args.command == "metrics":
        return _to_a_reader(lambda: metrics_command(settings, prometheus=args.prometheus))
    if args.command == "node-labels":
        return node_labels_command(settings, args.output)
    if args.command == "dra":
        from .dra import run  # the driver is loaded only to run it

        return run(settings, args)
    from .serve import serve  # the session is loaded only to serve

    return serve(settings, lambda: load_settings(args))


def _to_a_reader(command: Callable[[], int]) -> int:
    """Run a command that prints for a person; `gpu-device-plugin discover | head -3` stops
    reading early, which is not an error worth a traceback."""
    try:
        code = command()
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The interpreter flushes stdout once more at exit: point it at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _discover_once(settings: Settings) -> tuple[Choice, list[Gpu], str]:
    """The backend the plugin would choose, what it finds, and the error that stopped it ("" when none)."""
    choice = choose(settings)
    if choice.backend is None:
        return choice, [], ""
    try:
        return choice, choice.backend.discover(), ""
    except DiscoveryError as exc:
        return choice, [], str(exc)


def discover_command(settings: Settings, as_json: bool = False) -> int:
    choice, gpus, error = _discover_once(settings)
    advertised = policy.advertised_devices(gpus, settings)
    if as_json:
        import json

        print(json.dumps({
            "strategy": settings.device_discovery_strategy,
            "backend": choice.backend.name if choice.backend else None,
            "reason": choice.reason,
            "probes": {name: {"usable": p.usable, "reason": p.reason, "evidence": list(p.evidence)}
                       for name, p in choice.probes},
            "error": error or None,
            "resource": policy.resource_name(settings),
            "gpus": [{"id": g.id, "index": g.index, "name": g.name, "backend": g.backend,
                      "device_nodes": list(g.device_nodes), "optional_nodes": list(g.optional_nodes),
                      "numa_node": g.numa_node,
                      "memory_mib": g.memory_mib, "mig_enabled": g.mig_enabled,
                      "properties": dict(g.properties)} for g in gpus],
            "advertised": [d.id for d in advertised],
        }, indent=2))
        return 0 if gpus else 1
    print(f"strategy:  {settings.device_discovery_strategy}")
    for name, probe in choice.probes:
        print(f"probe {name}: {'usable' if probe.usable else 'not usable'}: {probe.reason}")
        for line in probe.evidence:
            print(f"    - {line}")
    print(f"decision:  {choice.reason}")
    if error:
        print(f"error:     {error}")
    for gpu in gpus:
        print(f"GPU {gpu.index}: {gpu.name} id={gpu.id} backend={gpu.backend}"
              + (f" memory={gpu.memory_mib}MiB" if gpu.memory_mib else "")
              + (f" numa={gpu.numa_node}" if gpu.numa_node is not None else "")
              + (" MIG-enabled (not handed out whole)" if gpu.mig_enabled else ""))
        for key, value in sorted(gpu.properties.items()):
            print(f"    {key}: {value}")
        print(f"    device nodes: {', '.join(gpu.device_nodes) or '(none)'}")
        if gpu.optional_nodes:
            print(f"    when present: {', '.join(gpu.optional_nodes)}")
    print(f"resource:  {policy.resource_name(settings)} x {len(advertised)}")
    return 0 if gpus else 1


def metrics_command(settings: Settings, prometheus: bool = False, nvml_module: Any = None) -> int:
    """Discover as the plugin does, read every GPU's metrics once, print them; 1 when there is no GPU."""
    from ..metrics.podresources import socket_beside
    from ..metrics.table import format_table
    from ..metrics.telemetry import LIST_TIMEOUT_S, Telemetry, make_collectors, plugin_mappers

    choice, gpus, error = _discover_once(settings)
    why = error or choice.reason
    if not gpus:
        print(f"no GPU: {why}")
        return 1
    telemetry = Telemetry(lambda: make_collectors(gpus, settings.host_root, nvml_module=nvml_module),
                          [gpu.id for gpu in gpus], socket_beside(settings.kubelet_socket),
                          mappers=plugin_mappers(settings, gpus),
                          wait=LIST_TIMEOUT_S + 1)  # one read for a person: wait for the kubelet's answer
    try:
        if prometheus:
            print(telemetry.render(), end="")
            return 0
        snapshot = telemetry.snapshot()
        if not snapshot.samples:
            print(f"{len(gpus)} GPU(s) found ({gpus[0].backend}), but no telemetry source reads them")
            return 1
        print(format_table(snapshot.samples, snapshot.holders, telemetry.node, snapshot.pods_error,
                           snapshot.pods_age))
        return 0
    finally:
        telemetry.close()


def node_labels_command(settings: Settings, output: str) -> int:
    """Label the node from discovery; no GPU (or a failed discovery) removes the labels, exit 0,
    so k3s (which runs this before it starts) is never held up by it."""
    from . import node_labels

    choice, gpus, error = _discover_once(settings)
    why = error or choice.reason
    labels = node_labels.gpu_labels(gpus, choice.backend.name if choice.backend else "")
    try:
        if not labels:
            removed = node_labels.remove(output)
            print(f"no GPU ({why}): {'removed ' + output if removed else 'no labels written'}")
            return 0
        node_labels.write_atomically(output, node_labels.drop_in(labels))
    except OSError as exc:
        print(f"gpu-device-plugin: cannot update {output} ({exc.strerror or exc}): check the path and that it "
              "runs as root", file=sys.stderr)
        return 1
    print(f"wrote {len(labels)} labels to {output}: " + ", ".join(f"{k}={v}" for k, v in sorted(labels.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
