"""The DRA driver: the same GPUs as the device plugin, published as ResourceSlices and prepared
per ResourceClaim as CDI devices (`gpu-device-plugin dra`)."""
