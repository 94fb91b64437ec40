"""The policy core: what is advertised, preferred and allocated, decided without I/O."""
