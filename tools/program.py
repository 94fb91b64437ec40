"""`./task`: invoke's command line, with parse errors a person can act on.

invoke says "No idea what '--artifcat-url' is!" and "'rollout' did not receive required
positional arguments: 'version'"; this names the task, the option it needs (as an option,
which is how the docs write it), the closest known name, and where the help is, and exits 2
like every other usage error of the tasks (tools/usage.py; invoke itself exits 1). Run by the
`task` script in place of the `invoke` binary; standard library and invoke only."""

from __future__ import annotations

import difflib
import os
import re
import sys

from invoke import Collection, Exit, Program, __version__
from invoke.exceptions import ParseError
from invoke.parser import ParserContext

_UNKNOWN = re.compile(r"^No idea what '(?P<token>.+)' is!$")
_MISSING = re.compile(r"^'(?P<task>[^']+)' did not receive required positional arguments: (?P<names>.+)$")


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


HELP_FLAGS = ("--help", "-h")


def help_request(words: list[str], task_names: set[str]) -> str | None:
    """The task whose help `./task TASK ... --help` asks for, else None.

    invoke fills a task's required positional argument with the next word, so after
    `rollout` the word `--help` became the version and the task ran instead of its help.
    The first word that names a task is the task; a help flag anywhere after it asks for
    that task's help, whatever else is on the line."""
    for index, word in enumerate(words):
        if word in task_names:
            return word if any(flag in words[index + 1:] for flag in HELP_FLAGS) else None
    return None


def option_before(token: str, argv: list[str]) -> str | None:
    """The option word given just before a value that invoke could not place."""
    for index, word in enumerate(argv[1:], start=1):
        if word == token and argv[index - 1].startswith("--"):
            return argv[index - 1]
    return None


def explain(message: str, context: ParserContext | None, collection: Collection | None,
            argv: list[str] | None = None) -> str:
    """A clearer one-line message for one of invoke's parse errors (others pass unchanged)."""
    missing = _MISSING.match(message)
    if missing:
        task = missing["task"]
        names = [_option(name.strip(" '")) for name in missing["names"].split(",")]
        needed = " and ".join(f"{name} VALUE" for name in names)
        return f"{task} needs {needed} (./task {task} --help)"
    unknown = _UNKNOWN.match(message)
    if not unknown:
        return message
    token = unknown["token"]
    if not token.startswith("-") and context is not None and context.name:
        # invoke fills a required option with the next word, a misspelt option included:
        # `rollout --versoin 1.4.0` leaves 1.4.0 over. Name the misspelt one instead.
        taken = [arg.value for arg in context.args.values() if isinstance(arg.value, str) and arg.value[:2] == "--"]
        # `release --version 1.0.0`: invoke takes --version as its own flag and leaves the value
        given = option_before(token, argv or [])
        if taken:
            token = taken[0]
        elif given is not None and given not in context.flags:
            token = given
        else:
            return (f"{context.name} does not take {token!r}: options are written --name VALUE "
                    f"(./task {context.name} --help)")
    if token.startswith("-") and context is not None and context.name:
        known = sorted(flag for flag in context.flags if flag.startswith("--"))
        close = difflib.get_close_matches(token.split("=", 1)[0], known, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        return f"{context.name} has no option {token}{hint} (./task {context.name} --help)"
    tasks = sorted(collection.task_names) if collection is not None else []
    close = difflib.get_close_matches(token, tasks, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"no task or option {token!r}{hint} (./task --list)"


def repeatable_option_without_value(words: list[str], parsed: list[ParserContext]) -> str | None:
    """invoke silently drops a repeatable option (a task's `iterable=`) given without a value:
    `flash --label --yes` would flash with no label. The first such option, as 'TASK --OPTION'."""
    contexts = {context.name: context for context in parsed}
    current: ParserContext | None = None
    seen: dict[tuple[str, str], int] = {}
    for word in words:
        if word in contexts:
            current = contexts[word]
            continue
        flag = word.split("=", 1)[0]
        if current is None or not flag.startswith("--") or flag not in current.flags:
            continue
        if current.flags[flag].kind is list:
            seen[(current.name, flag)] = seen.get((current.name, flag), 0) + 1
    for (name, flag), count in seen.items():
        if len(contexts[name].flags[flag].value) < count:
            return f"{name} {flag}"
    return None


USAGE_EXIT = 2  # tools/usage.py's EXIT_USAGE (this file runs before tools/ is importable)


class TaskProgram(Program):
    def parse_core(self, argv: list[str] | None) -> None:
        try:
            super().parse_core(argv)
        except ParseError as error:
            raise Exit(explain(str(error), getattr(error, "context", None), None), code=USAGE_EXIT) from None

    def parse_tasks(self) -> None:
        asked = help_request(list(self.core.unparsed), set(self.collection.task_names))
        if asked is not None:
            self.parser = self._make_parser()
            self.print_task_help(asked)
            raise Exit
        try:
            super().parse_tasks()
        except ParseError as error:
            context = getattr(error, "context", None)
            message = explain(str(error), context, getattr(self, "collection", None), list(self.argv or []))
            raise Exit(message, code=USAGE_EXIT) from None
        bare = repeatable_option_without_value(list(self.core.unparsed), list(self.tasks))
        if bare is not None:
            task, flag = bare.split(" ")
            raise Exit(f"{task} {flag} needs a value each time it is given: {flag} VALUE (./task {task} --help)",
                       code=USAGE_EXIT)


program = TaskProgram(name="meta-gpu-k8s tasks", binary="./task", version=__version__)

def main() -> int:
    try:
        program.run()
    except BrokenPipeError:
        # `./task --help flash | head`: the reader left; no traceback (Python's documented way).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
