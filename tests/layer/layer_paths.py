"""Paths the layer tests read (a module of its own: every test dir has a conftest.py)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYER = REPO / "meta-gpu-k8s"
KAS = REPO / "kas"
