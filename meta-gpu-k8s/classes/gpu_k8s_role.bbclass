# The k3s role baked into the image: "server" or "agent".
# Select it in local.conf (or kas/include/agent.yml): GPU_K8S_K3S_ROLE = "agent"
# A 4 GB Jetson Nano is an agent by default: the control plane (API server, datastore,
# controllers) would take memory its GPU shares; x86-64 machines are servers.
GPU_K8S_DEFAULT_K3S_ROLE = "server"
GPU_K8S_DEFAULT_K3S_ROLE:tegra210 = "agent"
GPU_K8S_K3S_ROLE ??= "${GPU_K8S_DEFAULT_K3S_ROLE}"

# nooelint: oelint.task.noanonpython - a wrong role must stop the parse, not build a wrong image
python () {
    role = d.getVar('GPU_K8S_K3S_ROLE')
    if role not in ('server', 'agent'):
        bb.fatal('GPU_K8S_K3S_ROLE must be "server" or "agent", got "%s" (set it in local.conf)' % role)
}
