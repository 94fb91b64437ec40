"""Check 1: does the plugin's config file parse, and what does it set?"""

from __future__ import annotations

from ..config import loader
from ..config.settings import ConfigError, Settings
from .report import FAIL, PASS, SKIP, WARN, Check


def evaluate_config_file(path: str, text: str | None, read_error: str = "") -> Check:
    name = "config file"
    if not path:
        return Check(name, SKIP, "no config file given: flags, environment and defaults only")
    if text is None:
        why = read_error or "it does not exist"
        return Check(name, FAIL, f"cannot read {path}: {why}",
                     "fix the path given with --config-file / CONFIG_FILE, or create the file")
    try:
        parsed = loader.parse_file(text, source=path)
    except ConfigError as exc:
        return Check(name, FAIL, str(exc),
                     f"correct the field named in {path}; a running plugin keeps its last good configuration "
                     "until then, a restarted one will not start")
    fields = [".".join(o.file_path) for o in loader.OPTIONS if o.attr in parsed.values]
    if parsed.time_slicing is not None:
        fields.append(f"sharing.timeSlicing (replicas {parsed.time_slicing.replicas})")
    sets = f"sets {', '.join(fields)}" if fields else "sets nothing (defaults apply)"
    if parsed.warnings:
        return Check(name, WARN, f"{path} parses and {sets}; " + "; ".join(parsed.warnings),
                     f"remove or correct the fields named in {path}: the plugin ignores them")
    return Check(name, PASS, f"{path} parses and {sets}")


def config_file_check(settings: Settings) -> Check:
    path = settings.config_file
    if not path:
        return evaluate_config_file("", None)
    try:
        with open(path, encoding="utf-8") as f:
            return evaluate_config_file(path, f.read())
    except OSError as exc:
        return evaluate_config_file(path, None, exc.strerror or str(exc))
