"""Message classes of the v1beta1 API as protobuf classes, for Python clients such as the
tests' kubelet double (`from gpu_device_plugin.api.pb import Device`). The plugin itself
uses `wire`, which reads and writes the same bytes without the protobuf runtime."""

from __future__ import annotations

from .schema import DEVICE_PLUGIN_PATH, HEALTHY, KUBELET_SOCKET, UNHEALTHY, VERSION, protobuf_classes

CLASSES = protobuf_classes()

DevicePluginOptions = CLASSES["DevicePluginOptions"]
RegisterRequest = CLASSES["RegisterRequest"]
Empty = CLASSES["Empty"]
ListAndWatchResponse = CLASSES["ListAndWatchResponse"]
TopologyInfo = CLASSES["TopologyInfo"]
NUMANode = CLASSES["NUMANode"]
Device = CLASSES["Device"]
PreStartContainerRequest = CLASSES["PreStartContainerRequest"]
PreStartContainerResponse = CLASSES["PreStartContainerResponse"]
PreferredAllocationRequest = CLASSES["PreferredAllocationRequest"]
ContainerPreferredAllocationRequest = CLASSES["ContainerPreferredAllocationRequest"]
PreferredAllocationResponse = CLASSES["PreferredAllocationResponse"]
ContainerPreferredAllocationResponse = CLASSES["ContainerPreferredAllocationResponse"]
AllocateRequest = CLASSES["AllocateRequest"]
ContainerAllocateRequest = CLASSES["ContainerAllocateRequest"]
CDIDevice = CLASSES["CDIDevice"]
AllocateResponse = CLASSES["AllocateResponse"]
ContainerAllocateResponse = CLASSES["ContainerAllocateResponse"]
Mount = CLASSES["Mount"]
DeviceSpec = CLASSES["DeviceSpec"]

__all__ = ["DEVICE_PLUGIN_PATH", "HEALTHY", "KUBELET_SOCKET", "UNHEALTHY", "VERSION", *CLASSES]
