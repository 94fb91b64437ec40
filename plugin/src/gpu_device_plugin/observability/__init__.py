"""What people and systemd see of the plugin: journald-friendly logs, sd_notify readiness and
the watchdog's self-probe, counters, and the optional /healthz and /metrics endpoint."""
