"""`gpu-device-plugin check`, the node doctor: is this node set up so that GPU pods get scheduled and see the GPU?

Each check answers one question a person asks while a GPU pod stays Pending (or runs without
the GPU) and says what to do when the answer is wrong. The `evaluate_*` functions are pure:
what was read (file text, socket state, discovery results) in, a `Check` out. `run.run_checks`
does the reads, under `settings.host_root`, and calls them in the order a GPU pod depends on
them: configuration, discovery, device nodes, registration with the kubelet, container runtime.

One module per concern: report (a Check and the report), host (reading under host_root),
config_file, gpu (discovery and device nodes), kubelet (sockets and checkpoint), k3s,
runtime (docker or containerd), csv_files (Jetson runtime lists), run (all, in order).
"""
