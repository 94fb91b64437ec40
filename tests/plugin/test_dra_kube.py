"""The driver's own Kubernetes client: kubeconfigs as k3s writes them (a client certificate the CA
signed, by file or inline) or with a bearer token, TLS verified against the cluster's CA, errors
with the status and the fix, watches; the driver's flags and how it finds its node name."""

from __future__ import annotations

import argparse
import base64
import shutil
import socket
import socketserver
import ssl
import subprocess
import threading
from pathlib import Path

import pytest
from fake_apiserver import FakeApiServer
from gpu_device_plugin.cli import dra as dra_cli
from gpu_device_plugin.config.settings import ConfigError
from gpu_device_plugin.dra import options
from gpu_device_plugin.dra.cluster import Cluster
from gpu_device_plugin.dra.http1 import HttpConnection, HttpError
from gpu_device_plugin.dra.kube import ApiError, KubeClient, KubeconfigError, load_kubeconfig, parse_kubeconfig


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(directory: Path, subject: str) -> None:
    # the extensions a CA needs under Python 3.13's strict verification (k3s's CAs, made by Go, have them)
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "ca.key",
            "-out", "ca.crt", "-days", "2", "-subj", subject, "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-addext", "subjectKeyIdentifier=hash", cwd=directory)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a kubelet-like client certificate (system:node:node-a)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make test certificates")
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "/CN=k3s-server-ca")
    leaf = "keyUsage=critical,digitalSignature\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    server_names = "subjectAltName=IP:127.0.0.1,DNS:apiserver-loopback-client"
    for name, subject, ext in (("server", "/CN=k3s", leaf + server_names),
                               ("client", "/O=system:nodes/CN=system:node:node-a",
                                leaf + "extendedKeyUsage=clientAuth")):
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}.key",
                "-out", f"{name}.csr", "-subj", subject, cwd=d)
        (d / f"{name}.ext").write_text(ext + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    return d


def tls_server(pki: Path) -> FakeApiServer:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki / "server.crt", pki / "server.key")
    context.load_verify_locations(pki / "ca.crt")
    context.verify_mode = ssl.CERT_REQUIRED  # as the API server with --client-ca-file: a certificate or no TLS
    return FakeApiServer(tls=context, token="")


def test_a_k3s_style_kubeconfig_with_certificate_files_relative_to_it_talks_tls(pki: Path, tmp_path: Path) -> None:
    with tls_server(pki) as api:
        for name in ("ca.crt", "client.crt", "client.key"):
            shutil.copy(pki / name, tmp_path / name)
        path = api.kubeconfig(str(tmp_path / "kubelet.kubeconfig"),
                              extra_user={"client-certificate": "client.crt", "client-key": "client.key"},
                              extra_cluster={"certificate-authority": "ca.crt"})
        client = KubeClient(load_kubeconfig(path))
        assert Cluster(client, "node-a", "d.example.com").list_slices() == ([], "100")


def test_inline_certificate_data_works_too(pki: Path, tmp_path: Path) -> None:
    def data(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    with tls_server(pki) as api:
        path = api.kubeconfig(str(tmp_path / "kc"),
                              extra_user={"client-certificate-data": data("client.crt"),
                                          "client-key-data": data("client.key")},
                              extra_cluster={"certificate-authority-data": data("ca.crt")})
        client = KubeClient(load_kubeconfig(path))
        with pytest.raises(ApiError) as missing:
            client.request("GET", "/api/v1/nodes/nowhere")
        assert missing.value.status == 404 and "node not found" in str(missing.value)


def test_a_server_whose_certificate_the_ca_did_not_sign_is_refused(pki: Path, tmp_path: Path) -> None:
    with tls_server(pki) as api:
        other_ca = tmp_path / "other"
        other_ca.mkdir()
        make_ca(other_ca, "/CN=someone-else")
        path = api.kubeconfig(str(tmp_path / "kc"),
                              extra_user={"client-certificate": str(pki / "client.crt"),
                                          "client-key": str(pki / "client.key")},
                              extra_cluster={"certificate-authority": str(other_ca / "ca.crt")})
        with pytest.raises(ApiError) as refused:
            KubeClient(load_kubeconfig(path)).request("GET", "/api/v1/nodes/x")
        assert refused.value.status == 0 and "certificate verify failed" in str(refused.value)


def test_a_token_file_is_read_at_each_call_and_a_wrong_token_is_a_401(tmp_path: Path) -> None:
    with FakeApiServer(token="first") as api:
        token = tmp_path / "token"
        token.write_text("first\n")
        client = KubeClient(load_kubeconfig(api.kubeconfig(str(tmp_path / "kc"), extra_user={"tokenFile": "token"})))
        assert client.request("GET", "/apis/resource.k8s.io/v1/resourceslices",
                              query={"fieldSelector": "spec.nodeName=node-a"})["items"] == []
        api.token = "second"  # rotated on the server and then in the file
        with pytest.raises(ApiError) as unauthorized:
            client.request("GET", "/apis/resource.k8s.io/v1/resourceslices",
                           query={"fieldSelector": "spec.nodeName=node-a"})
        assert unauthorized.value.status == 401
        token.write_text("second\n")
        assert client.request("GET", "/apis/resource.k8s.io/v1/resourceslices",
                              query={"fieldSelector": "spec.nodeName=node-a"})["items"] == []


def test_a_kept_alive_connection_the_server_closed_is_made_again_once(tmp_path: Path) -> None:
    """A server answers one request per connection, keep-alive said, then closes it (an API server
    restarting, an idle timeout): the next call finds the connection dead before any answer and is
    made again on a fresh one; a fresh connection that fails is an error, not a loop."""
    answered = []

    class OneShot(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            while self.rfile.readline() not in (b"\r\n", b""):
                pass
            body = b'{"kind": "Node", "metadata": {"uid": "u"}}'
            answered.append(1)  # before the answer: the client's next call may come at once
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), OneShot) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            path = tmp_path / "kc"
            url = f"http://127.0.0.1:{server.server_address[1]}"
            path.write_text(f"current-context: a\ncontexts: [{{name: a, context: {{cluster: c}}}}]\n"
                            f"clusters: [{{name: c, cluster: {{server: '{url}'}}}}]\n")
            client = KubeClient(load_kubeconfig(str(path)))
            for _ in range(3):
                assert client.request("GET", "/api/v1/nodes/a")["metadata"]["uid"] == "u"
            assert len(answered) == 3
        finally:
            server.shutdown()


def test_chunked_and_close_delimited_bodies_are_read_whole() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]

        def serve() -> None:
            conn, _ = listener.accept()
            with conn:
                reader = conn.makefile("rb")
                while reader.readline() not in (b"\r\n", b""):
                    pass
                conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                             b"5\r\n{\"a\":\r\n3;ext=1\r\n 1}\r\n0\r\nX-Trailer: t\r\n\r\n")
                while reader.readline() not in (b"\r\n", b""):
                    pass
                conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{\"b\": 2}")

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        connection = HttpConnection("127.0.0.1", port, None, 5)
        first = connection.send("GET", "/x", {}, None)
        assert connection.read_body(first) == b'{"a": 1}' and connection.reusable
        second = connection.send("GET", "/y", {}, None)
        assert connection.read_body(second) == b'{"b": 2}' and not connection.reusable
        connection.close()
        thread.join(5)


def test_a_response_that_breaks_http_framing_is_an_error_naming_it() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def serve() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.makefile("rb").readline()
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

        threading.Thread(target=serve, daemon=True).start()
        connection = HttpConnection("127.0.0.1", listener.getsockname()[1], None, 5)
        with pytest.raises(HttpError, match="not an HTTP/1.1 status line"):
            connection.send("GET", "/", {}, None)
        connection.close()


def test_unreachable_is_status_zero_naming_the_server(tmp_path: Path) -> None:
    with FakeApiServer() as api:
        path = api.kubeconfig(str(tmp_path / "kc"))
    with pytest.raises(ApiError) as down:
        KubeClient(load_kubeconfig(path), timeout=2).request("GET", "/api/v1/nodes/x")
    assert down.value.status == 0 and "127.0.0.1" in str(down.value)


@pytest.mark.parametrize(("text", "message"), [
    ("{", "not valid YAML"),
    ("apiVersion: v1\nkind: Config\n", "no current-context"),
    ("current-context: a\ncontexts: [{name: a, context: {cluster: c, user: u}}]\nclusters: []\n", "no cluster named"),
    ("current-context: a\ncontexts: [{name: a, context: {cluster: c}}]\n"
     "clusters: [{name: c, cluster: {server: 'ftp://x'}}]\n", "must be an https:// URL"),
    ("current-context: a\ncontexts: [{name: a, context: {cluster: c, user: u}}]\n"
     "clusters: [{name: c, cluster: {server: 'https://x'}}]\n"
     "users: [{name: u, user: {client-key-data: '***'}}]\n", "client-key-data is not base64"),
])
def test_a_kubeconfig_that_cannot_work_names_the_field(text: str, message: str) -> None:
    with pytest.raises(KubeconfigError, match="/etc/kc") as bad:
        parse_kubeconfig(text, "/etc/kc")
    assert message in str(bad.value)


def test_a_missing_kubeconfig_says_where_k3s_keeps_the_nodes_own(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError, match="kubelet.kubeconfig"):
        load_kubeconfig(str(tmp_path / "absent"))


def test_a_watch_streams_events_until_closed(tmp_path: Path) -> None:
    with FakeApiServer() as api:
        client = KubeClient(load_kubeconfig(api.kubeconfig(str(tmp_path / "kc"))))
        cluster = Cluster(client, "node-a", "d.example.com")
        _, version = cluster.list_slices()
        watch = cluster.watch_slices(version)
        cluster.create_slice({"metadata": {"generateName": "s-"}, "spec": {
            "driver": "d.example.com", "nodeName": "node-a", "pool": {"name": "node-a"}, "devices": []}})
        cluster.create_slice({"metadata": {"generateName": "s-"}, "spec": {  # another driver's: not ours to see
            "driver": "other.example.com", "nodeName": "node-a", "pool": {"name": "node-a"}, "devices": []}})
        events = iter(watch)
        kind, obj = next(events)
        assert (kind, obj["spec"]["driver"]) == ("ADDED", "d.example.com")
        watch.close()
        assert list(events) == []


# ---------------------------------------------------------------- flags and the node's name


def namespace(**flags: str) -> argparse.Namespace:
    return argparse.Namespace(**{o.attr: flags.get(o.attr) for o in options.OPTIONS})


def test_flags_beat_the_environment_and_defaults_follow_the_driver_name() -> None:
    settings = options.parse(namespace(driver_name="gpu.example.org"),
                             {"NODE_NAME": "orin-1", "CDI_DIR": "/etc/cdi", "KUBELET_PLUGINS_DIR": "/k/plugins",
                              "KUBELET_REGISTRAR_DIR": "/k/registry", "DRA_STATE_DIR": "/k/state"})
    assert (settings.driver_name, settings.node_name, settings.cdi_dir) == ("gpu.example.org", "orin-1", "/etc/cdi")
    # the Go harness's environment (conformance/README.md, "The DRA driver contract") as the node's
    assert settings.dra_socket == "/k/plugins/gpu.example.org/dra.sock"
    assert settings.registration_socket == "/k/registry/gpu.example.org-reg.sock"
    assert settings.checkpoint_dir == "/k/state"
    defaults = options.parse(namespace(), {})
    assert defaults.dra_socket == "/var/lib/kubelet/plugins/gpu.meta-gpu-k8s.io/dra.sock"
    assert defaults.registration_socket == "/var/lib/kubelet/plugins_registry/gpu.meta-gpu-k8s.io-reg.sock"
    assert defaults.checkpoint_dir == "/var/lib/kubelet/plugins/gpu.meta-gpu-k8s.io"


@pytest.mark.parametrize(("flags", "message"), [
    ({"driver_name": "gpu.nvidia.com"}, "--driver-name gpu.nvidia.com is NVIDIA's DRA driver's name"),
    ({"driver_name": "GPU"}, "--driver-name must be a lowercase DNS subdomain"),
    ({"cdi_dir": "cdi"}, "--cdi-dir must be an absolute path"),
    ({"multiple_allocations": "maybe"}, "--multiple-allocations must be one of auto, on, off"),
    ({"node_name": "Node_A"}, "--node-name must be a Kubernetes node name"),
])
def test_a_bad_flag_is_refused_naming_it(flags: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        options.parse(namespace(**flags), {})


def test_the_node_name_comes_from_the_nodes_own_identity_once_the_server_answers(tmp_path: Path) -> None:
    with FakeApiServer(user="system:node:orin-7") as api:
        client = KubeClient(load_kubeconfig(api.kubeconfig(str(tmp_path / "kc"))))
        api.fail_next(503, 503)  # a server still starting
        assert dra_cli.resolve_node(client, "") == "orin-7"
        assert dra_cli.resolve_node(client, "given") == "given"
        api.user = "system:serviceaccount:kube-system:gpu"
        with pytest.raises(ConfigError, match="pass --node-name"):
            dra_cli.resolve_node(client, "")


def test_a_kubeconfig_naming_its_key_by_file_is_kept_parsed_and_one_with_a_token_never(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    by_file = ("current-context: a\ncontexts: [{name: a, context: {cluster: c, user: u}}]\n"
               "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:6444', certificate-authority: ca.crt}}]\n"
               "users: [{name: u, user: {client-certificate: c.crt, client-key: c.key}}]\n")
    config = parse_kubeconfig(by_file, "/var/lib/rancher/k3s/agent/kubelet.kubeconfig", str(cache_dir))
    assert config.key_file == "/var/lib/rancher/k3s/agent/c.key"
    assert (cache_dir / "kubeconfig.json").exists()  # the next start needs no PyYAML for it
    assert parse_kubeconfig(by_file, "/var/lib/rancher/k3s/agent/kubelet.kubeconfig", str(cache_dir)) == config
    (cache_dir / "kubeconfig.json").unlink()
    with_token = by_file.replace("client-certificate: c.crt, client-key: c.key", "token: s3cret")
    assert parse_kubeconfig(with_token, "/etc/kc", str(cache_dir)).token == "s3cret"
    assert not (cache_dir / "kubeconfig.json").exists(), "a secret must never land in the cache directory"


def test_tls_server_name_is_the_name_checked_and_sent(pki: Path, tmp_path: Path) -> None:
    """kube-apiserver's loopback credentials (what a test server hands out) name `tls-server-name:
    apiserver-loopback-client`: the server picks that certificate by SNI, and it is the name checked."""
    user = {"client-certificate": str(pki / "client.crt"), "client-key": str(pki / "client.key")}
    with tls_server(pki) as api:
        good = api.kubeconfig(str(tmp_path / "good"), extra_user=user, extra_cluster={
            "certificate-authority": str(pki / "ca.crt"), "tls-server-name": "apiserver-loopback-client"})
        with pytest.raises(ApiError) as missing:
            KubeClient(load_kubeconfig(good)).request("GET", "/api/v1/nodes/absent")
        assert missing.value.status == 404  # through TLS, verified against the name
        wrong = api.kubeconfig(str(tmp_path / "wrong"), extra_user=user, extra_cluster={
            "certificate-authority": str(pki / "ca.crt"), "tls-server-name": "somebody-else"})
        with pytest.raises(ApiError) as refused:
            KubeClient(load_kubeconfig(wrong)).request("GET", "/api/v1/nodes/absent")
        assert refused.value.status == 0 and "somebody-else" in str(refused.value)
