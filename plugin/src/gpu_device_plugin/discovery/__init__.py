"""Discovery backends: which GPUs are on this machine, read through a root prefix."""
