"""Health monitors: event-driven where the platform has events; devices recover."""
