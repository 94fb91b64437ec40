"""`./task flash`: writing a built image onto a Jetson (USB recovery), an SD card or an x86-64 disk, per board."""
