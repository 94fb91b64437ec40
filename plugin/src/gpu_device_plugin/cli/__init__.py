"""`gpu-device-plugin`: the command line and the subcommands a person runs (main), serving
(serve: discovery, the health monitor, then the daemon), and the k3s node-labels drop-in
(node_labels)."""
