"""Plugin tests run against the source tree, on every Python/grpcio/protobuf combination CI uses."""

from __future__ import annotations

import sys
from pathlib import Path

PLUGIN_SRC = Path(__file__).resolve().parents[2] / "plugin" / "src"
if str(PLUGIN_SRC) not in sys.path:
    sys.path.insert(0, str(PLUGIN_SRC))
