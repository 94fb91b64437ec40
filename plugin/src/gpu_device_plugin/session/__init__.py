"""The kubelet session: serve first, then register; follow the kubelet's restarts through
its socket directory; reload the configuration; stop cleanly on SIGTERM."""
