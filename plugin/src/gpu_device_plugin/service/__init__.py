"""The DevicePlugin gRPC service: the servicer (protobuf to the policy core and back) and the
server that serves it on our socket, with the Register call that hands that socket to the kubelet."""
