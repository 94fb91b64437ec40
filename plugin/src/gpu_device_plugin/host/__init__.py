"""The host OS as more than one part uses it: inotify (the session's socket directory, the
health monitors' device nodes) and paths on a host whose / may be mounted at --host-root."""
