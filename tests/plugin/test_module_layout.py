"""The policy core stays apart from the CLI: importing it loads no argument parsing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "plugin" / "src"


def test_the_policy_core_does_not_import_the_cli_or_argparse() -> None:
    probe = ("import sys, gpu_device_plugin.policy, gpu_device_plugin.servicer, gpu_device_plugin.state; "
             "print(sorted(m for m in ('argparse', 'gpu_device_plugin.cli', 'gpu_device_plugin.config') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], env={"PYTHONPATH": str(SRC)}, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"
