"""`./task smoke-test`: boot an image in QEMU (or reach a board over SSH) and check it runs GPU pods."""
