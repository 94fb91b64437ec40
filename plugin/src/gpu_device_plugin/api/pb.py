"""Message classes of the v1beta1 API as protobuf classes, for Python clients such as the
tests' kubelet double (`from gpu_device_plugin.api.pb import Device`). The plugin itself
uses `wire`, which reads and writes the same bytes without the protobuf runtime."""

from __future__ import annotations

from .schema import DEVICE_PLUGIN_PATH, HEALTHY, KUBELET_SOCKET, UNHEALTHY, VERSION, protobuf_classes

CLASSES = protobuf_classes()

# every message class as a module attribute under its proto name (wire.Device, pb.Device)
globals().update(CLASSES)

__all__ = ["DEVICE_PLUGIN_PATH", "HEALTHY", "KUBELET_SOCKET", "UNHEALTHY", "VERSION", *CLASSES]
