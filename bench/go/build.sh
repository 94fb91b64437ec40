#!/usr/bin/env bash
# Build the Go side of the benchmark into build/bench-go/bin (ignored; nothing built is committed):
#   kubelet-client  the kubelet's own device manager as the client (conformance/cmd/kubelet-client)
#   stub-plugin     Kubernetes' own device plugin stub as the reference (conformance/cmd/stub-plugin)
# both from conformance/, the Go module that pins k8s.io/kubernetes to our k3s's version, its
# modules from the Go module proxy. The module and build caches are the test leg's, under
# build/go/, so after ./task test this takes seconds.
#
#   bench/go/build.sh
#
# BENCH_GO_OUT moves the output (bench/kubelet_bench.py reads the same variable).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${BENCH_GO_OUT:-$repo/build/bench-go}"
cache="${GPU_K8S_BUILD_ROOT:-$repo/build}/go"

if ! command -v go >/dev/null 2>&1; then
    echo "error: go is not installed. fix: install Go >= $(sed -n 's/^go //p' "$repo/conformance/go.mod")" >&2
    exit 1
fi
export GOMODCACHE="$cache/mod" GOCACHE="$cache/cache" GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:-} -modcacherw"
mkdir -p "$out/bin"
cd "$repo/conformance"
go build -o "$out/bin/" ./cmd/kubelet-client ./cmd/stub-plugin
kubernetes="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
grpc="$(go list -m -f '{{.Version}}' google.golang.org/grpc)"
echo "$(go env GOVERSION), k8s.io/kubernetes $kubernetes, grpc-go $grpc" > "$out/bin/stack.txt"
echo "built: $out/bin/kubelet-client $out/bin/stub-plugin ($(cat "$out/bin/stack.txt"))"
