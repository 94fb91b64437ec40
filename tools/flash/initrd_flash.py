"""meta-tegra's `initrd-flash` as the Orin and Thor paths run it: the command, the verdict read
from the log it writes, and that log kept past the temporary unpacked package.

Its exit status is no verdict on either chip (meta-tegra wrynose 727633de, initrd-flash.sh):
- T234 (Orin, CHIPID 0x23): the flashing initrd on the board writes SUCCESS or FAILED into its
  status file (tegra-flash-init's init-flash.sh); the host reads it back, prints
  "Final status: <status>" into log.initrd-flash.<date> and exits 0 whatever the status was.
- T264 (Thor, CHIPID 0x26): NVIDIA's unified flash is piped through tee into the same log and the
  script exits 0 whatever it returned; NVIDIA's flash_bsp_images.py ends with one of its result
  lines (bootburn_t264_py/flash_bsp_images.py, as the public Seeed-Studio/Linux_for_Tegra copy
  06119ad6 of the unified flash tools has it; the R39.2 BSP tarball is not in our mirrors).
So the log decides, the same way for both: a failure line, or no result line at all, is an error,
and the logs (with the board's device-logs-<date>/ on the Orin) are kept and named either way."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tools import console, process
from tools.flash import usb
from tools.flash.flash import FlashError, FlashOptions

ARGS = {"full": [], "spi-only": ["--qspi-only"], "external-only": ["--external-only"]}
# What initrd-flash leaves in the directory it runs in: its own log and, on the Orin, the logs
# the board sends back.
LOGS = ("log.initrd-flash.*", "device-logs-*")
_FINAL_STATUS = re.compile(r"^Final status: *(?P<status>.*?)\s*$", re.M)
ORIN_DONE = "SUCCESS"  # init-flash.sh's word for a board that wrote everything it was sent
UNIFIED_FLASH_DONE = "Flashing finished Successfully"
UNIFIED_FLASH_FAILED = ("Flashing finished Unsuccessfully", "raised in flash BSP")


@dataclass(frozen=True)
class Verdict:
    """What a log says: 'done', 'failed', or None when it has no result line; and that line."""

    outcome: str | None
    line: str = ""


def orin_verdict(log_text: str) -> Verdict:
    """The board's own report (T234): the last "Final status:" line, SUCCESS or anything else."""
    found = list(_FINAL_STATUS.finditer(log_text))
    if not found:
        return Verdict(None)
    last = found[-1]
    return Verdict("done" if last["status"] == ORIN_DONE else "failed", last.group(0).strip())


def _line_with(text: str, marker: str) -> str:
    line = next(line for line in text.splitlines() if marker in line)
    return re.sub(r"\x1b\[[0-9;]*m", "", line).strip()  # the unified flash colours its result


def thor_verdict(log_text: str) -> Verdict:
    """NVIDIA's unified flash (T264): a failure or an exception anywhere wins over a success line
    (one of its flash steps can fail while another reports success)."""
    for marker in UNIFIED_FLASH_FAILED:
        if marker in log_text:
            return Verdict("failed", _line_with(log_text, marker))
    if UNIFIED_FLASH_DONE in log_text:
        return Verdict("done", _line_with(log_text, UNIFIED_FLASH_DONE))
    return Verdict(None)


@dataclass(frozen=True)
class Chip:
    """How initrd-flash reports on one chip family."""

    family: str  # "Orin", "Thor": the board in messages
    chip_id: str  # CHIPID in the package's .env.initrd-flash
    reporter: str  # who writes the result line
    expected: str  # the line a good flash ends with
    read: Callable[[str], Verdict]


ORIN = Chip("Orin", "0x23", "the board", f"Final status: {ORIN_DONE}", orin_verdict)
THOR = Chip("Thor", "0x26", "NVIDIA's unified flash", f"{UNIFIED_FLASH_DONE}!!", thor_verdict)


def keep_logs(workdir: Path) -> Path | None:
    """Copies initrd-flash's logs out of the unpacked package, a temporary directory removed when
    flashing ends, into a directory of their own that stays; None when it left none."""
    found = sorted(path for pattern in LOGS for path in workdir.glob(pattern))
    if not found:
        return None
    kept = Path(tempfile.mkdtemp(prefix="gpu-k8s-flash-logs-"))
    for path in found:
        if path.is_dir():
            shutil.copytree(path, kept / path.name)
        else:
            shutil.copy2(path, kept / path.name)
    return kept


def where_logs_are(kept: Path | None) -> str:
    return f"its logs are kept in {kept}" if kept else "it left no log.initrd-flash.* file"


def latest_log_text(workdir: Path) -> str:
    """The newest log.initrd-flash.<date> (the dates sort), '' when there is none."""
    logs = sorted(workdir.glob("log.initrd-flash.*"))
    return logs[-1].read_text(errors="replace") if logs else ""


AGAIN = "put the board back in recovery mode, check the USB cable (no hub, no VM) and run again"
IT_AGAIN = AGAIN.replace("the board", "it", 1)


def judge(workdir: Path, chip: Chip) -> tuple[Verdict, Path | None]:
    """initrd-flash exited 0: the verdict of its log, with the logs kept. Raises FlashError for a
    failure line and for a log with no result line."""
    verdict = chip.read(latest_log_text(workdir))
    kept = keep_logs(workdir)
    if verdict.outcome == "failed":
        raise FlashError(
            f"initrd-flash exited 0, but {chip.reporter} reports a failure (\"{verdict.line}\"); "
            f"{where_logs_are(kept)} and say why: the board is not flashed; {IT_AGAIN}"
        )
    if verdict.outcome is None:
        raise FlashError(
            f"initrd-flash exited 0, but its log has no result line from {chip.reporter} (\"{chip.expected}\"), "
            f"so the {chip.family} is not known to be flashed ({where_logs_are(kept)}); {AGAIN}"
        )
    return verdict, kept


def run(options: FlashOptions, board: usb.RecoveryBoard | None, workdir: Path, chip: Chip) -> list[str]:
    """initrd-flash in the unpacked package, on the board's USB port; summary lines. Raises
    FlashError when it exits non-zero or its log does not say the board was flashed."""
    argv = ["./initrd-flash", *ARGS[options.method]]
    if board is not None:
        # The port we checked, so a second Jetson on this host is never the one flashed.
        argv += ["--usb-instance", board.sysfs_name]
    console.step("flashing over USB (initrd-flash; takes many minutes, keep the board connected)")
    try:
        # initrd-flash calls sudo itself for the steps that need root.
        process.run(process.Command(argv, cwd=workdir), dry_run=options.dry_run)
    except process.CommandFailed as failure:
        # The unpacked package goes with the temporary directory: the logs that say why must not.
        raise FlashError(
            f"initrd-flash failed with exit code {failure.returncode}; {where_logs_are(keep_logs(workdir))} "
            f"and say why: {AGAIN}"
        ) from None
    if options.dry_run or board is None:
        return [f"(dry run) would flash ({options.method}) the {chip.family} in recovery mode"]
    verdict, kept = judge(workdir, chip)
    return [f"flashed ({options.method}) the {board.model or chip.family} at USB port {board.sysfs_name}",
            f"{chip.reporter} reported \"{verdict.line}\"; initrd-flash's logs are kept in {kept}"]
