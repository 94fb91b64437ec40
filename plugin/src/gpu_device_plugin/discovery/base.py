"""The contract every discovery backend keeps.

A backend knows its hardware and nothing about gRPC or the kubelet. It reads the OS
under `root` (default "/") so tests point it at fixture trees.
"""

from typing import NamedTuple, Protocol

from ..model import Gpu


class Probe(NamedTuple):
    """Whether a backend applies to this machine, and the evidence either way."""

    usable: bool
    reason: str  # one human line: what was found or missing, and why that decides
    evidence: tuple[str, ...] = ()  # e.g. ("/etc/nv_tegra_release: R32.7.6",)


class DiscoveryError(Exception):
    """Discovery could not run; the message names what is missing and the usual fix."""


class Backend(Protocol):
    name: str

    def probe(self) -> Probe:
        """Cheap check: does this backend apply here? Never raises."""
        ...

    def discover(self) -> list[Gpu]:
        """The GPUs present now. Raises DiscoveryError with a fix-it message on failure."""
        ...
