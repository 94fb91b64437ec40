"""Message classes of the v1beta1 API, importable by name (`from ..api.pb import Device`)."""

from __future__ import annotations

from .schema import CLASSES

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

# Constants of the kubelet's v1beta1 contract.
VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
DEVICE_PLUGIN_PATH = "/var/lib/kubelet/device-plugins/"
KUBELET_SOCKET = DEVICE_PLUGIN_PATH + "kubelet.sock"
