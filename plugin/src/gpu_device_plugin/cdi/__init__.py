"""How a GPU reaches the container: CDI names (names), the spec we write for Jetson and
simulated GPUs (spec) and when it is written (lifecycle), the NVIDIA Container Toolkit's
generated spec (toolkit_spec) and the runtime configuration that decides the hand-over
(toolkit_config)."""
