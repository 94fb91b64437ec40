"""N fake GPUs for QEMU smoke tests and demos; nothing is read from the machine."""

from __future__ import annotations

from ..model import Gpu
from .base import DiscoveryError, Probe


class SimulatedBackend:
    name = "simulated"

    def __init__(self, count: int) -> None:
        self.count = count

    def probe(self) -> Probe:
        if self.count < 1:
            return Probe(False, "simulated GPUs need --simulated-gpus N (N >= 1)")
        return Probe(True, f"{self.count} simulated GPU(s) from configuration")

    def discover(self) -> list[Gpu]:
        if self.count < 1:
            raise DiscoveryError("simulated: --simulated-gpus must be 1 or more")
        return [
            Gpu(id=f"sim-gpu-{i}", index=i, name="Simulated GPU", backend="simulated", memory_mib=1024,
                properties={"simulated": "true"})
            for i in range(self.count)
        ]
