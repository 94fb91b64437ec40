"""gpu-k8s-update: the node side of fleet OS updates (Mender A/B, health gate, rollout job)."""

__version__ = "0.1.0"
