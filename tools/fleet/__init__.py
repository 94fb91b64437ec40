"""The fleet: `./task release` collects signed artifacts, `./task rollout` rolls them out over the cluster."""
