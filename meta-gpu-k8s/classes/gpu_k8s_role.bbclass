# The k3s role baked into the image: "server" (default) or "agent".
# Select it in local.conf (or kas/include/agent.yml): GPU_K8S_K3S_ROLE = "agent"
GPU_K8S_K3S_ROLE ??= "server"

# nooelint: oelint.task.noanonpython - a wrong role must stop the parse, not build a wrong image
python () {
    role = d.getVar('GPU_K8S_K3S_ROLE')
    if role not in ('server', 'agent'):
        bb.fatal('GPU_K8S_K3S_ROLE must be "server" or "agent", got "%s" (set it in local.conf)' % role)
}
