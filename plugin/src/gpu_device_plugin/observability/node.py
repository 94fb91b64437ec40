"""The node's name on every series the plugin serves: dcgm-exporter's `Hostname` label.

NODE_NAME when set (the Kubernetes node name, where it differs from the host's), else the
host's name, which k3s names the node after by default. One function, so the plugin's own
figures and the GPUs' carry the same value and one dashboard filter selects both.
"""

import os
import socket
from collections.abc import Mapping


def node_name(environ: Mapping[str, str] | None = None) -> str:
    environ = os.environ if environ is None else environ
    return environ.get("NODE_NAME") or socket.gethostname()
