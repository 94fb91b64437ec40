"""Exit codes of gate and upgrade: what the rollout job and a person read from them."""

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_ROLLED_BACK = 3  # the new slot failed (gate, watchdog, firmware): the rollout must stop at this node
EXIT_GATE_TIMEOUT = 4
EXIT_GAVE_UP = 5
EXIT_NO_UPDATER = 6  # not an A/B image, or its A/B tools are missing: nothing here can update or judge
EXIT_UNGATED = 7  # running the target, but something committed it before the gate passed it
EXIT_NOT_FOR_THIS_DEVICE = 8  # no artifact offered for this node's Mender device type: nothing touched
EXIT_BUSY = 75  # EX_TEMPFAIL: someone else's update is pending
