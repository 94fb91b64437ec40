"""A kas configuration loaded the way kas loads it, before kas runs: the files of the argument
(a.yml:b.yml), their lock files and every file they include, each read as YAML and validated
against kas's own schema by kas's own include handler (kas.includehandler). Offline: our includes
are files of this repository; an include from another repository (`repo:`, `file:`) needs that
repository checked out, so it is left to kas. What kas would refuse here, it refuses only after
`./task build` has checked the host; `build --dry-run` asks first."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import yaml

from tools.dev.lint import kas_schema_errors
from tools.paths import REPO_ROOT


def _shown(path: Path, root: Path) -> Path:
    return path.relative_to(root) if path.is_relative_to(root) else path


def _includers(missing: Path, kas_files: Sequence[Path], root: Path) -> list[str]:
    """Which of our kas files name `missing` as an include (kas's message names only the file)."""
    found = []
    for path in sorted({*kas_files, *(root / "kas").glob("**/*.yml")}):
        try:
            document = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        includes = (document.get("header") or {}).get("includes") or [] if isinstance(document, dict) else []
        for include in includes:
            if isinstance(include, str) and missing in ((root / include).resolve(), (path.parent / include).resolve()):
                found.append(str(_shown(path, root)))
    return found


def _described(message: str, kas_files: Sequence[Path], root: Path) -> str:
    """kas's one-line reason, with the file relative to the repository, who includes a missing
    one, and the schema's own words for a file that does not validate."""
    reason, _, filename = message.rpartition(": ")
    path = Path(filename)
    if not reason or not path.is_absolute():
        return message
    shown = _shown(path, root)
    if "not found" in reason:
        by = _includers(path.resolve(), kas_files, root)
        return f"{shown} does not exist" + (f" (included by {', '.join(by)})" if by else "")
    if "validating" in reason:
        return f"{shown} does not follow kas's schema: {'; '.join(kas_schema_errors(path)) or reason}"
    return f"{shown}: {reason}"


def config_errors(kas_files: Sequence[Path], root: Path = REPO_ROOT) -> list[str]:
    """What kas would refuse in these files before it fetched anything: a missing file or include,
    a file that is not YAML or not kas's schema. [] when kas loads them all (or kas is not
    importable here: then kas reports it when it runs)."""
    try:
        from kas.includehandler import IncludeHandler
        from kas.kasusererror import KasUserError
    except ImportError:
        return []

    class LocalIncludes(IncludeHandler):
        def ensure_from_same_repo(self) -> None:
            """Every file is one of this repository's: no git (kas asks git for the repository root)."""

    handler = LocalIncludes([str(path) for path in kas_files], use_lock=True)
    handler.__dict__["top_repo_path"] = str(root)  # kas's cached property, without asking git
    logging.disable(logging.CRITICAL)  # kas logs each schema error itself; they are reported below
    try:
        handler.get_config()
    except KasUserError as error:
        return [_described(str(error), kas_files, root)]
    finally:
        logging.disable(logging.NOTSET)
    return []
