"""Running external programs: printable plans, dry runs, and progress on long work."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from tools import console


@dataclass(frozen=True)
class Command:
    """One program run as the person would type it: argv, working directory and the
    environment variables we set on top of the inherited environment."""

    argv: Sequence[str]
    cwd: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    def shell_line(self) -> str:
        """The exact command line, copy-pasteable into a shell."""
        parts: list[str] = []
        if self.cwd is not None:
            parts.append(f"cd {shlex.quote(str(self.cwd))} &&")
        parts.extend(f"{key}={shlex.quote(value)}" for key, value in sorted(self.env.items()))
        parts.append(shlex.join(str(arg) for arg in self.argv))
        return " ".join(parts)

    def full_env(self) -> dict[str, str]:
        merged = dict(os.environ)
        merged.update(self.env)
        return merged


class CommandFailed(Exception):
    """A program exited non-zero; carries the command and the tail of its output."""

    def __init__(self, command: Command, returncode: int, output_tail: Sequence[str] = ()) -> None:
        self.command = command
        self.returncode = returncode
        self.output_tail = list(output_tail)
        super().__init__(f"command failed with exit code {returncode}: {command.shell_line()}")


def run(command: Command, *, dry_run: bool = False, stdin: str | None = None) -> int:
    """Run a command with its output going straight to the terminal.

    In a dry run the command line is printed and nothing runs. Raises CommandFailed."""
    console.info(("would run: " if dry_run else "running: ") + command.shell_line())
    if dry_run:
        return 0
    completed = subprocess.run(
        [str(a) for a in command.argv],
        cwd=command.cwd,
        env=command.full_env(),
        input=stdin,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        raise CommandFailed(command, completed.returncode)
    return 0


# bitbake prints these while it works; a task count is the best progress measure it gives.
_BITBAKE_TASK = re.compile(r"Running (setscene )?task (\d+) of (\d+) \((.+)\)")


@dataclass
class BitbakeProgress:
    """Condensed progress from bitbake's log lines: the latest task number and name."""

    done: int = 0
    total: int = 0
    setscene: bool = False
    current: str = ""

    def update(self, line: str) -> bool:
        """Feed one output line; True when it moved the progress."""
        match = _BITBAKE_TASK.search(line)
        if not match:
            return False
        self.setscene = bool(match.group(1))
        self.done = int(match.group(2))
        self.total = int(match.group(3))
        self.current = match.group(4).rsplit("/", 1)[-1]
        return True

    def line(self) -> str:
        kind = "setscene " if self.setscene else ""
        percent = 100 * self.done // self.total if self.total else 0
        return f"[{kind}task {self.done}/{self.total} {percent:3d}%] {self.current}"


def run_logged(
    command: Command,
    log_path: Path,
    *,
    verbose: bool = False,
    progress_every_s: float = 10.0,
    out: TextIO | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run a long command, its whole output going to log_path.

    verbose streams every line; otherwise one condensed progress line (bitbake task
    counts) is shown: rewritten in place on a terminal, printed every progress_every_s
    seconds otherwise. Returns the exit code; raises CommandFailed with the last lines."""
    out = out or sys.stdout
    log_path.parent.mkdir(parents=True, exist_ok=True)
    interactive = out.isatty()
    progress = BitbakeProgress()
    tail: deque[str] = deque(maxlen=40)
    last_printed = clock()
    console.info(f"running: {command.shell_line()}")
    console.info(f"full log: {log_path}")
    with log_path.open("w", encoding="utf-8") as log:
        process = subprocess.Popen(
            [str(a) for a in command.argv],
            cwd=command.cwd,
            env=command.full_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
        )
        assert process.stdout is not None
        try:
            for line in process.stdout:
                log.write(line)
                tail.append(line.rstrip("\n"))
                if verbose:
                    out.write(line)
                    out.flush()
                    continue
                moved = progress.update(line)
                if interactive and moved:
                    out.write("\r\033[K" + progress.line()[:150])
                    out.flush()
                elif moved and clock() - last_printed >= progress_every_s:
                    out.write(progress.line() + "\n")
                    out.flush()
                    last_printed = clock()
            returncode = process.wait()
        except BaseException:
            # Ctrl-C or SIGTERM: stop the child before we go, never leave it running.
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
            raise
    if interactive and not verbose and progress.total:
        out.write("\n")
    if returncode != 0:
        raise CommandFailed(command, returncode, list(tail))
    return returncode
