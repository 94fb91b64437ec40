"""Kubelet device plugin API v1beta1: message classes and gRPC method wiring."""
