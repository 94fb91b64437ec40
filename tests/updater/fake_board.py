"""A simulated A/B board for the agent's tests: stand-ins at the OS boundary only.

`mender-update`, `fw_printenv` (or GRUB's `grub-mender-grubenv-print`), `reboot` and
`kubectl` are small executables on PATH that act on one JSON state file the way the real ones
act on the board: `install` writes the other slot and sets upgrade_available=1 (as Mender's
rootfs-image module does), `commit` clears it, `rollback` switches back while it is set,
`reboot` kills its caller (the agent is killed by its own reboot), and `Board.power_cycle()`
runs Mender's boot counter (bootlimit=1: a second boot with upgrade_available=1 returns to
the other slot). Each boot writes the booted slot's image-info, as the image carries it.
The Jetson Orin/Thor board (meta-mender-tegra's native scheme) is in fake_tegra.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from socketserver import UnixStreamServer
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
UPDATER_SRC = REPO_ROOT / "updater" / "src"
SLOT_A, SLOT_B = "2", "3"

# Shared by every fake: load and save the board state under a lock file.
_PRELUDE = """\
import fcntl, json, os, signal, sys
STATE = {state!r}
def load():
    with open(STATE) as f:
        return json.load(f)
def save(s):
    tmp = STATE + ".tmp"
    with open(tmp, "w") as f:
        json.dump(s, f, indent=1)
    os.replace(tmp, STATE)
lock = open(STATE + ".lock", "w")
fcntl.flock(lock, fcntl.LOCK_EX)
s = load()
args = sys.argv[1:]
"""

_MENDER = """\
s["calls"].append(["mender-update", *args])
env = s["bootenv"]
def other(part):
    return "3" if part == "2" else "2"
if args[0] == "install":
    source = args[1]
    artifact = s["artifacts"].get(source)
    if s["in_progress"]:
        save(s); print("Update already in progress. Please commit or roll back first"); sys.exit(1)
    if artifact is None:
        save(s); print("Could not fulfill request: 404 Not Found"); sys.exit(1)
    s["in_progress"] = {"artifact": artifact["name"], "state": "Download"}
    if artifact.get("kill_caller_during_install"):
        artifact["kill_caller_during_install"] -= 1
        save(s); os.kill(os.getppid(), signal.SIGKILL); sys.exit(1)
    passive = other(env["mender_boot_part"])
    s["slots"][passive] = artifact["name"]
    env.update(mender_boot_part=passive, upgrade_available="1", bootcount="0")
    s["in_progress"]["state"] = "ArtifactInstall"
    save(s); print("Installed, but not committed."); sys.exit(0)
if args[0] == "commit":
    if not s["in_progress"]:
        save(s); print("No update in progress."); sys.exit(2)
    if env["upgrade_available"] != "1":
        save(s); print("Upgrade failed and was reverted: refusing to commit!"); sys.exit(1)
    env["upgrade_available"] = "0"
    s["committed"].append(s["in_progress"]["artifact"]); s["in_progress"] = None
    save(s); print("Committed."); sys.exit(0)
if args[0] == "rollback":
    if not s["in_progress"]:
        save(s); print("No update in progress."); sys.exit(2)
    if env["upgrade_available"] == "1":
        env.update(mender_boot_part=other(env["mender_boot_part"]), upgrade_available="0")
    s["in_progress"] = None
    save(s); print("Rolled back."); sys.exit(0)
save(s); print("No such action: " + args[0]); sys.exit(1)
"""

_PRINTENV = """\
save(s)
for key in args:
    if key not in s["bootenv"]:
        print("## Error: \\"%s\\" not defined" % key, file=sys.stderr); sys.exit(1)
    print("%s=%s" % (key, s["bootenv"][key]))
"""

_REBOOT = """\
s["reboots"] += 1
save(s)
if s.get("reboot_kills_caller", True):
    os.kill(os.getppid(), signal.SIGKILL)
"""

_KUBECTL = """\
s["calls"].append(["kubectl", *args])
save(s)
if s["api_down"]:
    print("The connection to the server 127.0.0.1:6443 was refused - did you specify the right host or port?",
          file=sys.stderr)
    sys.exit(1)
words = [a for a in args if not a.startswith("--kubeconfig") and not a.startswith("--request-timeout")
         and a != s.get("kubeconfig_path")]
if words[:2] == ["get", "node"]:
    registered = s["node"]["metadata"]["name"] if s["node"] else None
    if len(words) > 2 and words[2] != registered:
        print('Error from server (NotFound): nodes "%s" not found' % words[2], file=sys.stderr)
        sys.exit(1)
    print(json.dumps(s["node"]))
elif words[:2] == ["patch", "node"]:
    # kubectl patch node NAME --type merge -p JSON: the node's own annotations (publish.py)
    registered = s["node"]["metadata"]["name"] if s["node"] else None
    if words[2] != registered:
        print('Error from server (NotFound): nodes "%s" not found' % words[2], file=sys.stderr)
        sys.exit(1)
    patch = json.loads(words[words.index("-p") + 1])
    annotations = s["node"]["metadata"].setdefault("annotations", {})
    annotations.update(patch["metadata"]["annotations"])
    s.setdefault("published", []).append(dict(patch["metadata"]["annotations"]))
    save(s)
    print("node/%s patched" % words[2])
elif words[:2] == ["delete", "pod"]:
    s["smoke_pod"] = None
    save(s)
elif words[:1] == ["apply"]:
    manifest = json.load(sys.stdin)
    if s.get("smoke_forbidden"):
        print('Error from server (Forbidden): pods is forbidden: User "system:node:nano-1" cannot create resource',
              file=sys.stderr)
        sys.exit(1)
    s["smoke_pod"] = manifest
    s["smoke_pods_created"] = s.get("smoke_pods_created", 0) + 1
    save(s)
    print("pod/gpu-k8s-update-smoke created")
elif words[:2] == ["get", "pod"]:
    if not s.get("smoke_pod"):
        print('Error from server (NotFound): pods "gpu-k8s-update-smoke" not found', file=sys.stderr)
        sys.exit(1)
    outcome = s.get("smoke_outcome", "Succeeded")
    status = {"phase": outcome}
    if outcome == "Failed":
        status.update(reason="UnexpectedAdmissionError",
                      message="Allocate failed due to no healthy devices present; cannot allocate unhealthy devices")
    print(json.dumps({"kind": "Pod", "status": status}))
else:
    print("fake kubectl: unexpected " + " ".join(args), file=sys.stderr)
    sys.exit(3)
"""


def node_object(ready: bool = True, gpus: int = 1, name: str = "nano-1") -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": name},
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True" if ready else "False",
                 "reason": "KubeletReady" if ready else "KubeletNotReady"},
            ],
            "allocatable": {"cpu": "4", "nvidia.com/gpu": str(gpus)},
        },
    }


class _Health(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        body = b"ok" if self.server.status == 200 else b"[-]ping failed"  # type: ignore[attr-defined]
        self.send_response(self.server.status)  # type: ignore[attr-defined]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass

    def address_string(self) -> str:
        return "local"


class HealthServer:
    """A kubelet-style healthz endpoint on 127.0.0.1 whose answer the test sets."""

    def __init__(self) -> None:
        self.server = HTTPServer(("127.0.0.1", 0), _Health)
        self.server.status = 200  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/healthz"

    def set_status(self, status: int) -> None:
        self.server.status = status  # type: ignore[attr-defined]

    def start(self) -> HealthServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _UnixHTTPServer(UnixStreamServer):
    status = 200


class _DockerPing(_Health):
    def do_GET(self) -> None:
        body = b"OK" if self.path == "/_ping" else b"not found"
        self.send_response(200 if self.path == "/_ping" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class DockerSocket:
    """docker's API socket, answering only /_ping."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.server = _UnixHTTPServer(str(path), _DockerPing)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> DockerSocket:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class SimulatedNode:
    """What every simulated node shares: stand-ins on PATH acting on one JSON state file, the
    image-info of the booted slot, the boot id, the data partition, the kubelet's checkpoint."""

    backend = ""  # the ab_backend its images name

    def __init__(self, root: Path, state: dict[str, Any], scripts: dict[str, str], device_type: str = "") -> None:
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir(parents=True)
        # Mender's device type, on the data partition (/var/lib/mender/device_type)
        self.device_type = device_type
        self.device_type_file = root / "data" / "mender" / "device_type"
        self.device_type_file.parent.mkdir(parents=True, exist_ok=True)
        self.device_type_file.write_text(f"device_type={device_type}\n")
        self.state_file = root / "board.json"
        self.image_info = root / "usr-share-gpu-k8s-update-image-info"
        self.boot_id_file = root / "boot_id"
        self.data = root / "data" / "gpu-k8s-update"
        self.kubeconfig = root / "kubelet.kubeconfig"
        self.kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
        self.checkpoint = root / "kubelet_internal_checkpoint"
        self._save({
            "in_progress": None,
            "committed": [],
            "artifacts": {},
            "calls": [],
            "reboots": 0,
            "boots": 0,
            "api_down": False,
            "node": node_object(),
            "kubeconfig_path": str(self.kubeconfig),
            **state,
        })
        for name, body in {"reboot": _REBOOT, "kubectl": _KUBECTL, **scripts}.items():
            script = self.bin / name
            script.write_text(f"#!{sys.executable}\n" + _PRELUDE.format(state=str(self.state_file)) + body)
            script.chmod(0o755)
        self._linux_up()
        self.register_plugin()

    def make_server(self) -> None:
        """A k3s server image: its server unit exists (the gate then needs its own API server)."""
        (self.root / "k3s.service").write_text("[Service]\nExecStart=/usr/bin/k3s server\n")

    # --- state -------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return json.loads(self.state_file.read_text())

    def _save(self, state: dict[str, Any]) -> None:
        self.state_file.write_text(json.dumps(state, indent=1))

    def change(self, **values: Any) -> None:
        state = self.state()
        state.update(values)
        self._save(state)

    def publish(self, url: str, name: str, kill_caller_during_install: int = 0, **extra: Any) -> None:
        """Make an artifact downloadable from `url`."""
        state = self.state()
        state["artifacts"][url] = {"name": name, "kill_caller_during_install": kill_caller_during_install, **extra}
        self._save(state)

    def mender_calls(self, action: str) -> int:
        return sum(1 for call in self.state()["calls"] if call[:2] == ["mender-update", action])

    @property
    def running(self) -> str:
        """The release of the booted slot, as its image-info says."""
        for line in self.image_info.read_text().splitlines():
            name, _, value = line.partition("=")
            if name == "artifact_name":
                return value
        raise AssertionError(f"{self.image_info} has no artifact_name")

    def marker(self) -> dict[str, Any] | None:
        path = self.data / "marker.json"
        return json.loads(path.read_text()) if path.exists() else None

    def gate_result(self) -> dict[str, Any] | None:
        path = self.data / "gate-result.json"
        return json.loads(path.read_text()) if path.exists() else None

    # --- what the kubelet and the plugin left behind -------------------------------------
    def register_plugin(self, gpus: int = 1) -> None:
        devices = {"nvidia.com/gpu": [f"gpu-{index}" for index in range(gpus)]} if gpus else {}
        self.checkpoint.write_text(json.dumps({"Data": {"PodDeviceEntries": None, "RegisteredDevices": devices},
                                               "Checksum": 1}))

    def set_node(self, ready: bool = True, gpus: int = 1, name: str = "nano-1") -> None:
        self.change(node=node_object(ready, gpus, name))

    # --- booting -------------------------------------------------------------------------
    def booted_artifact(self, state: dict[str, Any]) -> str:
        raise NotImplementedError

    def booted_slot(self) -> str:
        """The slot this boot runs."""
        raise NotImplementedError

    def written_slot(self) -> str:
        """The slot the last install wrote."""
        raise NotImplementedError

    def _linux_up(self) -> None:
        """Linux has booted: a new boot id, and the booted root filesystem's image-info."""
        self.boot_id_file.write_text(str(uuid.uuid4()) + "\n")
        name = self.booted_artifact(self.state())
        self.image_info.write_text(f"artifact_name={name}\nab_backend={self.backend}\n")

    # --- running the agent -------------------------------------------------------------
    def environment(self, kubelet_url: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {
            "PATH": f"{self.bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "PYTHONPATH": str(UPDATER_SRC),
            "GPU_K8S_UPDATE_STATE_DIR": str(self.data),
            "GPU_K8S_UPDATE_IMAGE_INFO": str(self.image_info),
            "GPU_K8S_UPDATE_BOOT_ID_FILE": str(self.boot_id_file),
            "GPU_K8S_UPDATE_REBOOT_COMMAND": "reboot",
            "GPU_K8S_UPDATE_KUBECTL_COMMAND": "kubectl",
            "GPU_K8S_UPDATE_KUBECONFIGS": str(self.kubeconfig),
            "GPU_K8S_UPDATE_STATUS_KUBECONFIGS": str(self.kubeconfig),
            "GPU_K8S_UPDATE_K3S_SERVER_UNITS": str(self.root / "k3s.service"),
            "GPU_K8S_UPDATE_MENDER_DEVICE_TYPE_FILE": str(self.device_type_file),
            "GPU_K8S_UPDATE_NODE_NAME": "nano-1",
            "GPU_K8S_UPDATE_DOCKER_SOCKET": "",
            "GPU_K8S_UPDATE_DOCKER_DAEMON": str(self.root / "no-dockerd"),
            "GPU_K8S_UPDATE_KUBELET_HEALTHZ_URL": kubelet_url,
            "GPU_K8S_UPDATE_PLUGIN_CHECKPOINT": str(self.checkpoint),
            "GPU_K8S_UPDATE_POLL_INTERVAL_S": "0.05",
            "GPU_K8S_UPDATE_GATE_TIMEOUT_S": "2",
            "GPU_K8S_UPDATE_UNREACHABLE_GRACE_S": "0.5",
            "GPU_K8S_UPDATE_WAIT_FOR_GATE_S": "20",
            "GPU_K8S_UPDATE_REBOOT_WAIT_S": "10",
            # where the layer's data-partition scripts leave their verdicts (data_partition.py)
            "GPU_K8S_UPDATE_DATA_STATE_FILE": str(self.root / "run" / "gpu-k8s" / "data-state.json"),
            "GPU_K8S_UPDATE_DATA_EVENTS_FILE": str(self.root / "data" / "gpu-k8s" / "data-events.log"),
        }
        env.update(extra or {})
        return env


# The program that prints the bootloader environment with each Mender integration.
ENV_PRINTERS = {"mender-uboot": "fw_printenv", "mender-grub": "grub-mender-grubenv-print"}
# Mender's device type of each simulated machine, unless a test names another.
DEVICE_TYPES = {"mender-uboot": "jetson-nano-devkit", "mender-grub": "genericx86-64"}


class Board(SimulatedNode):
    """A Jetson Nano (U-Boot, the default) or an x86-64 node (GRUB): two slots, a bootloader
    environment with Mender's boot counter, Mender's rootfs-image module, the API's view."""

    def __init__(self, root: Path, running: str = "gpu-k8s-1.0.0", backend: str = "mender-uboot",
                 device_type: str = "") -> None:
        self.backend = backend
        super().__init__(root, {
            "bootenv": {"mender_boot_part": SLOT_A, "upgrade_available": "0", "bootcount": "0", "bootlimit": "1"},
            "slots": {SLOT_A: running, SLOT_B: "gpu-k8s-0.0.0"},
        }, {"mender-update": _MENDER, ENV_PRINTERS[backend]: _PRINTENV},
            device_type or DEVICE_TYPES[backend])

    @property
    def pending(self) -> bool:
        return self.state()["bootenv"]["upgrade_available"] == "1"

    def booted_artifact(self, state: dict[str, Any]) -> str:
        return state["slots"][state["bootenv"]["mender_boot_part"]]

    def booted_slot(self) -> str:
        return self.state()["bootenv"]["mender_boot_part"]

    def written_slot(self) -> str:
        return self.state()["bootenv"]["mender_boot_part"]

    # --- the bootloader ----------------------------------------------------------------
    def power_cycle(self) -> None:
        """Mender's boot counter (U-Boot's bootcount/altbootcmd, GRUB's mender_grubenv): with
        upgrade_available=1 the first boot tries the new slot; a boot beyond bootlimit returns
        to the other slot with upgrade_available=0."""
        state = self.state()
        env = state["bootenv"]
        if env["upgrade_available"] == "1":
            env["bootcount"] = str(int(env["bootcount"]) + 1)
            if int(env["bootcount"]) > int(env["bootlimit"]):
                env["mender_boot_part"] = SLOT_B if env["mender_boot_part"] == SLOT_A else SLOT_A
                env["upgrade_available"] = "0"
        state["boots"] += 1
        self._save(state)
        self._linux_up()


def agent_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpu_k8s_update", *args]


def run_agent(env: Mapping[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(agent_command(*args), env=dict(env), capture_output=True, text=True, timeout=timeout,
                          check=False)


@contextmanager
def running_agent(env: Mapping[str, str], *args: str) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(agent_command(*args), env=dict(env), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


def describe(result: subprocess.CompletedProcess[str]) -> str:
    return textwrap.indent(f"exit {result.returncode}\n{result.stdout}\n{result.stderr}", "  | ")
