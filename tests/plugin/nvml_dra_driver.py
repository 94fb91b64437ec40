"""Our DRA driver on an x86-64 host with two NVIDIA L4s, for the Go harness (conformance/dra,
machine "nvml"): the fake NVML (nvidia-ml-py's names) stands in for pynvml inside the driver's own
process, which is then started as `gpu-device-plugin` would be, arguments unchanged. The host tree
to pass is fixtures/x86-nvidia-580, whose toolkit CDI spec names these two GPUs."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fake_nvml import FakeGpu, FakeNvml

sys.modules["pynvml"] = FakeNvml(  # type: ignore[assignment]  # what `import pynvml` then finds
    [FakeGpu("GPU-6a3c9e2f-0d4b-4c1e-9a57-1b2c3d4e5f60", name="NVIDIA L4", minor=0),
     FakeGpu("GPU-7b4d0f30-1e5c-4d2f-8b68-2c3d4e5f6071", name="NVIDIA L4", minor=1, pci_bus_id="00000000:5E:00.0")],
    driver_version="580.105.08", cuda_driver_version=13000)

from gpu_device_plugin.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
