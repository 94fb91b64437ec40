#!/usr/bin/env bash
# Build the Go side of the benchmark (kubelet-client, reference-plugin) offline, from
# Debian's Go packages, into build/bench-go/ (ignored; nothing generated is committed).
#
#   sudo apt-get install golang-go golang-google-grpc-dev golang-google-protobuf-dev \
#        golang-github-golang-protobuf-1-5-dev protobuf-compiler protoc-gen-go protoc-gen-go-grpc
#   bench/go/build.sh                 # stubs from the plugin's own deviceplugin.proto
#   KUBELET_API_PROTO=/path/to/k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto bench/go/build.sh
#
# The stubs come from the v1beta1 proto with protoc-gen-go and protoc-gen-go-grpc, in a
# GOPATH under the build directory with /usr/share/gocode (Debian's Go sources) behind it.
# BENCH_GO_OUT moves the output (bench/kubelet_bench.py reads the same variable).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${BENCH_GO_OUT:-$repo/build/bench-go}"
proto="${KUBELET_API_PROTO:-$repo/plugin/src/gpu_device_plugin/api/deviceplugin.proto}"
gocode="${GOCODE:-/usr/share/gocode}"

missing=()
for tool in go protoc protoc-gen-go protoc-gen-go-grpc; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[[ -d "$gocode/src/google.golang.org/grpc" ]] || missing+=("golang-google-grpc-dev")
# grpc-go's codec goes through github.com/golang/protobuf: 1.3 cannot marshal protoc-gen-go's (API v2) messages
[[ -f "$gocode/src/github.com/golang/protobuf/proto/registry.go" ]] || missing+=("golang-github-golang-protobuf-1-5-dev")
if (( ${#missing[@]} )); then
    echo "error: missing ${missing[*]}. fix: sudo apt-get install golang-go golang-google-grpc-dev" \
         "golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev protobuf-compiler protoc-gen-go protoc-gen-go-grpc" >&2
    exit 1
fi
if [[ ! -f "$proto" ]]; then
    echo "error: $proto does not exist. fix: point KUBELET_API_PROTO at the v1beta1 api.proto" >&2
    exit 1
fi

stub="$out/gopath/src/k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
rm -rf "$out/gopath" && mkdir -p "$stub" "$out/bin" "$out/proto"
# older api.proto files import gogoproto for Go options only: drop them, the wire stays the same
sed -e '/gogoproto/d' -e 's/\[(gogoproto[^]]*\]//g' "$proto" > "$out/proto/api.proto"
module="k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
protoc -I "$out/proto" --go_out="$stub" --go_opt=paths=source_relative --go_opt="Mapi.proto=$module" \
    --go-grpc_out="$stub" --go-grpc_opt=paths=source_relative --go-grpc_opt="Mapi.proto=$module" api.proto

export GO111MODULE=off GOPATH="$out/gopath:$gocode" GOFLAGS= CGO_ENABLED=0
for program in kubelet-client reference-plugin; do
    mkdir -p "$out/gopath/src/bench/$program"
    cp "$here/$program/main.go" "$out/gopath/src/bench/$program/"
    go build -trimpath -o "$out/bin/$program" "bench/$program"
done
grpc_go="$(dpkg-query -W -f='${Version}' golang-google-grpc-dev 2>/dev/null || echo unknown)"
echo "$(go version | cut -d' ' -f3), grpc-go ${grpc_go%%-*}" > "$out/bin/stack.txt"
echo "built: $out/bin/kubelet-client $out/bin/reference-plugin ($(go version | cut -d' ' -f3), stubs from $proto)"
