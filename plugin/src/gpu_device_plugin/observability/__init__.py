"""What people and systemd see of the plugin: journald-friendly logs, sd_notify readiness,
counters, and the optional /healthz and /metrics endpoint. These are handed their data and
import no other part of the plugin."""
