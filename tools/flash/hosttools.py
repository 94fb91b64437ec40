"""Host programs a flash path runs, each with the Debian package that has it, so that a missing
one is named before anything is unpacked or written (tools/flash/flash.py's require_host_tools
turns the list into a refusal, or into a warning on a dry run)."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class HostTool:
    program: str
    package: str  # Debian/Ubuntu

    def named(self) -> str:
        return f"{self.program} (apt-get install {self.package})"


BMAPTOOL = HostTool("bmaptool", "bmap-tools")  # writes SD and disk images (tools/flash/flash.py)
DEBUGFS = HostTool("debugfs", "e2fsprogs")  # writes provisioning into the data partition
ZSTD = HostTool("zstd", "zstd")  # unpacks the Orin's and Thor's .tegraflash-tar.zst


def missing(tools: Iterable[HostTool]) -> list[HostTool]:
    return [tool for tool in tools if shutil.which(tool.program) is None]


def missing_message(tools: Iterable[HostTool], needs: str) -> str | None:
    """'NEEDS needs a (apt-get install p), b (...)'; None when every tool is on PATH."""
    absent = missing(tools)
    return f"{needs} needs {', '.join(tool.named() for tool in absent)}" if absent else None
