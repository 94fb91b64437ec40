"""Plain values the decisions are made from: what was observed, what was remembered, what to do."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class Phase(str, enum.Enum):
    """How far an install got. Written before each step, so a kill leaves the last one started."""

    INSTALLING = "installing"  # mender-update install started (streaming into the other slot)
    INSTALLED = "installed"  # install returned success; the next boot is the new slot


@dataclass(frozen=True)
class Marker:
    """The 'tried' marker on the data partition: it survives the slot switch and a rollback."""

    version: str
    artifact_url: str
    phase: Phase
    boot_id: str  # the boot the phase was written in: a different one means we rebooted since
    from_version: str
    attempts: int = 1
    gpus_before: int | None = None  # nvidia.com/gpu allocatable before the update; None: unknown
    # Reboots asked for because the old slot came up with the switch still staged (Tegra: the
    # boot firmware had not applied the capsule): bounded, so a firmware that never applies
    # it cannot keep the node rebooting.
    switch_reboots: int = 0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["phase"] = self.phase.value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Marker:
        return cls(
            version=str(data["version"]),
            artifact_url=str(data["artifact_url"]),
            phase=Phase(data["phase"]),
            boot_id=str(data["boot_id"]),
            from_version=str(data.get("from_version", "")),
            attempts=int(data.get("attempts", 1)),
            gpus_before=None if data.get("gpus_before") is None else int(data["gpus_before"]),
            switch_reboots=int(data.get("switch_reboots", 0)),
        )


@dataclass(frozen=True)
class BootState:
    """What the A/B backend sees of an update in flight, in plain values (ab/*.py read it)."""

    pending: bool  # installed, neither committed nor rolled back (Mender's upgrade_available=1)
    # The new slot starts only once the boot firmware has applied a staged capsule on a later
    # reset (Tegra): the old slot running now is not a rollback.
    switch_staged: bool = False
    # Something marked the new slot good before the health gate judged it: what was seen.
    committed_early: str = ""
    # The boot chain and the root filesystem do not run the same slot: what was seen.
    slot_problem: str = ""


@dataclass(frozen=True)
class UpdateFacts:
    """What the upgrade command sees on the node right now."""

    target: str
    booted_version: str  # artifact_name of the running rootfs
    pending: bool  # an update is installed and not committed (BootState.pending)
    boot_id: str
    marker: Marker | None
    switch_staged: bool = False  # BootState.switch_staged
    gate_outcome: str | None = None  # the gate's last verdict about the target version, if any


class GateOutcome(str, enum.Enum):
    """The gate's verdict in gate-result.json, as the upgrade command reads it back."""

    COMMITTING = "committing"  # written just before mender-update commit: the verdict was pass
    COMMITTED = "committed"
    ROLLED_BACK = "rolled-back"
    # The update was found committed with no pass of ours: something else committed it.
    COMMITTED_ELSEWHERE = "committed-elsewhere"


class Step(str, enum.Enum):
    DONE = "done"  # running the target, committed
    WAIT_FOR_GATE = "wait-for-gate"  # running the target, the health gate has not decided yet
    ROLLED_BACK = "rolled-back"  # we installed the target, rebooted, and are back on the old slot
    REBOOT = "reboot"  # installed in this boot, killed before the reboot: reboot now
    INSTALL = "install"  # install (again) from the artifact URL, then reboot
    BUSY = "busy"  # someone else's update is pending: refuse to touch it
    GIVE_UP = "give-up"  # installs keep getting interrupted
    UNGATED = "ungated"  # running the target, committed, but not by the health gate


@dataclass(frozen=True)
class Decision:
    step: Step
    reason: str
    clean_first: bool = False  # clear Mender's half-done state (mender-update rollback) before installing
    count_reboot: bool = False  # a REBOOT because the staged switch has not happened: count it in the marker


@dataclass(frozen=True)
class NodeStatus:
    """The node as the API server reports it."""

    ready: bool
    ready_reason: str
    gpus_allocatable: int


@dataclass(frozen=True)
class HealthFacts:
    """One round of the gate's probes. A probe's detail says why it failed ('' when fine)."""

    docker_ok: bool | None  # None: not checked (not a docker node)
    docker_detail: str
    kubelet_ok: bool
    kubelet_detail: str
    node: NodeStatus | None  # None: the API server could not be asked about this node
    node_detail: str
    plugin_registered: bool  # the kubelet has nvidia.com/gpu from our plugin in this boot
    plugin_detail: str
    plugin_healthz_ok: bool | None = None  # None: no metrics address configured
    smoke_ok: bool | None = None  # None: no GPU smoke pod was run
    smoke_detail: str = ""
    # With node None: True when the API server answered with an error (the node is unknown
    # to it, the credentials are refused): a failing check, never an outage.
    api_answered: bool = False


@dataclass(frozen=True)
class GatePolicy:
    timeout_s: float
    gpu_expected: bool
    unreachable_grace_s: float  # how long the API may be unreachable before local checks suffice
    # A server judges its own API server (the update brought it, and the cluster depends on it):
    # an API server that never answers is a failed check, never an outage to wait out.
    api_required: bool = False


class Outcome(str, enum.Enum):
    PASS = "pass"
    WAIT = "wait"
    FAIL = "fail"


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    reason: str
    problems: tuple[str, ...] = field(default=())
