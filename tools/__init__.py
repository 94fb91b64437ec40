"""Host-side tooling for meta-gpu-k8s: build, flash, smoke-test, lint and test.

`tasks.py` at the repository root wires these modules into invoke tasks; each module
keeps its decisions in plain functions (testable without processes) and its I/O thin.
"""
