"""GPU telemetry under dcgm-exporter's names, for NVML GPUs and Jetsons alike.

The shape of NVIDIA's dcgm-exporter (pkg/dcgmexporter): each source is a collector behind
one interface (`collector.Collector`: `nvml`, `tegra`); the fields are data (`fields`, in
the format of dcgm-exporter's counter CSV); the Kubernetes step (`attribution`, fed by the
kubelet's PodResources API through `podresources` and `pod_mapping`) names the pod on a GPU
one container holds and splits every GPU into pod shares, one series per GPU either way;
`exposition` writes the Prometheus text; `telemetry` ties them together with a short cache,
and `table` prints the same values for a person (`gpu-device-plugin metrics`). Nothing here
is imported unless /metrics or that command asks for it.
"""
