"""`gpu-device-plugin`: the command line (main), serving and the subcommands a person on the
board runs; node_labels is the k3s drop-in the node-labels subcommand writes."""
