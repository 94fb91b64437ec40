"""NodePrepareResources and NodeUnprepareResources behind the gRPC service: read the claim, plan it
(claims.plan), apply its sharing settings, write its CDI spec (claim_spec), record it in the
checkpoint, and answer with the CDI device IDs; undo all of it on unprepare.

Both are idempotent, as the kubelet retries them: a claim already in the checkpoint is answered
from it (its spec written again if it went, e.g. /var/run/cdi emptied by a reboot), without
reading the API server; an unknown claim unprepares as success, its spec file removed by UID.
A pod without a claim of ours never reaches this code and gets no GPU: the only way to one is a
CDI device named here. One claim's failure is that claim's error, never the others'.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from ..cdi.gpu_edits import GpuEdits
from ..model import Gpu
from . import claim_spec
from .attributes import device_name
from .checkpoint import Checkpoint
from .claims import PrepareRefused, plan
from .kube import ApiError
from .sharing import refusal_for, time_slice_commands

log = logging.getLogger(__name__)


class ClaimRef(NamedTuple):
    namespace: str
    uid: str
    name: str


class PreparedDevice(NamedTuple):
    requests: list[str]  # base request names (subrequests stripped), as the kubelet matches them
    pool: str
    device: str
    cdi_ids: list[str]
    share_id: str


class Outcome(NamedTuple):
    devices: list[PreparedDevice]
    error: str = ""


def run_command(argv: list[str]) -> str:
    """Run a node command (nvidia-smi); its error output, or "" when it succeeded."""
    import subprocess  # only for time-slicing settings on a dGPU

    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return "" if done.returncode == 0 else (done.stderr or done.stdout).strip()[-300:] or f"exit {done.returncode}"


class Preparer:
    def __init__(self, driver: str, pool: str, cdi_dir: str, checkpoint: Checkpoint,
                 get_claim: Callable[[str, str], Mapping[str, Any]], gpus: Callable[[], Sequence[Gpu]],
                 edits: Callable[[Sequence[Gpu]], Mapping[str, GpuEdits | str]],
                 run: Callable[[list[str]], str] = run_command) -> None:
        self.driver = driver
        self.pool = pool
        self.cdi_dir = cdi_dir
        self.checkpoint = checkpoint
        self.get_claim = get_claim
        self.gpus = gpus
        self.edits = edits
        self.run = run
        self.prepared_count = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------ prepare

    def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, Outcome]:
        out: dict[str, Outcome] = {}
        for ref in refs:
            try:
                out[ref.uid] = Outcome(self._prepare_one(ref))
            except (PrepareRefused, ApiError, OSError) as exc:
                message = (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)
                log.warning("prepare %s/%s (%s) failed: %s", ref.namespace, ref.name, ref.uid, message)
                out[ref.uid] = Outcome([], message)
        return out

    def _prepare_one(self, ref: ClaimRef) -> list[PreparedDevice]:
        with self._lock:
            known = self.checkpoint.claims.get(ref.uid)
            if known is not None:
                if known.get("spec"):  # an unchanged file is not rewritten
                    claim_spec.write(known["spec"], self.cdi_dir, self.driver, ref.uid)
                return [PreparedDevice(**d) for d in known["devices"]]
        claim = self.get_claim(ref.namespace, ref.name)  # outside the lock: the slow part
        gpus = {device_name(g): g for g in self.gpus()}
        claim_plan = plan(claim, ref.uid, self.driver, self.pool, set(gpus))
        chosen = {p.device: gpus[p.device] for p in claim_plan.devices}
        for planned in claim_plan.devices:
            refusal = refusal_for(planned.config, chosen[planned.device].backend, planned.device)
            if refusal:
                raise PrepareRefused(f"ResourceClaim {ref.namespace}/{ref.name}: {refusal}")
        sources = self.edits(list(chosen.values()))
        edits: dict[str, GpuEdits] = {}
        for device, gpu in chosen.items():
            found = sources.get(gpu.id)
            if not isinstance(found, GpuEdits):
                why = found or f"no CDI edits for {device}"
                raise PrepareRefused(f"ResourceClaim {ref.namespace}/{ref.name}: {why}")
            edits[device] = found
        for planned in claim_plan.devices:
            gpu = chosen[planned.device]
            for argv in time_slice_commands(planned.config, gpu.id) if gpu.backend == "nvml" else []:
                problem = self.run(argv)
                if problem:
                    raise PrepareRefused(f"ResourceClaim {ref.namespace}/{ref.name}: {' '.join(argv)} failed: "
                                         f"{problem}")
        devices = [PreparedDevice([p.base_request], p.pool, p.device,
                                  [claim_spec.cdi_device_id(self.driver, ref.uid, p.device)], p.share_id)
                   for p in claim_plan.devices]
        with self._lock:
            if ref.uid in self.checkpoint.claims:  # prepared meanwhile by a retry: keep the first answer
                return [PreparedDevice(**d) for d in self.checkpoint.claims[ref.uid]["devices"]]
            spec = claim_spec.build(self.driver, ref.uid, edits) if edits else None
            if spec is not None:
                claim_spec.write(spec, self.cdi_dir, self.driver, ref.uid)
            self.checkpoint.claims[ref.uid] = {"namespace": ref.namespace, "name": ref.name, "spec": spec,
                                               "devices": [d._asdict() for d in devices]}
            try:
                self.checkpoint.save()
            except OSError:
                del self.checkpoint.claims[ref.uid]
                claim_spec.remove(self.cdi_dir, self.driver, ref.uid)
                raise
            self.prepared_count += 1
        log.info("prepared ResourceClaim %s/%s (%s): %s", ref.namespace, ref.name, ref.uid,
                 ", ".join(f"{d.device}{'/' + d.share_id if d.share_id else ''} for {','.join(d.requests)}"
                           for d in devices) or "no device of ours")
        return devices

    # ------------------------------------------------------------ unprepare

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        out: dict[str, str] = {}
        for ref in refs:
            with self._lock:
                try:
                    claim_spec.remove(self.cdi_dir, self.driver, ref.uid)
                    entry = self.checkpoint.claims.pop(ref.uid, None)
                    if entry is not None:
                        try:
                            self.checkpoint.save()
                        except OSError:
                            self.checkpoint.claims[ref.uid] = entry
                            raise
                        log.info("unprepared ResourceClaim %s/%s (%s)", ref.namespace, ref.name, ref.uid)
                    out[ref.uid] = ""
                except OSError as exc:
                    log.warning("unprepare %s/%s (%s) failed: %s", ref.namespace, ref.name, ref.uid, exc)
                    out[ref.uid] = str(exc)
        return out
