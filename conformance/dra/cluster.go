// Package dra checks a DRA driver against real Kubernetes code: an in-process kube-apiserver on
// embedded etcd serving resource.k8s.io/v1, the kubelet's plugin manager (watching a
// plugins_registry directory) and DRA manager, and the scheduler's structured allocator. The
// driver under test runs as a process started from a command (README.md, "The DRA driver
// contract"); the tests prove the harness with a driver written in the test itself.
package dra

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"testing"

	"github.com/google/uuid"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/storage/etcd3/testserver"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/client-go/kubernetes"
	restclient "k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	kubeapiservertesting "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"
)

// NodeName is the node the kubelet side runs as.
const NodeName = "node-1"

// Cluster is a kube-apiserver with its etcd, a Node object and a kubeconfig for it.
type Cluster struct {
	Config     *restclient.Config
	Client     kubernetes.Interface
	Kubeconfig string
	Node       *v1.Node
}

// StartCluster starts etcd (embedded, in this process) and kube-apiserver (in this process) for
// the test's lifetime.
func StartCluster(t *testing.T) *Cluster {
	etcd := testserver.RunEtcd(t, nil)
	storage := storagebackend.NewDefaultConfig(path.Join(uuid.New().String(), "registry"), nil)
	storage.Transport.ServerList = etcd.Endpoints()
	server := kubeapiservertesting.StartTestServerOrDie(t, nil, []string{
		// no endpoint reconciler and no ServiceAccount admission: nothing runs their controllers
		"--endpoint-reconciler-type=none",
		"--disable-admission-plugins=ServiceAccount",
	}, storage)
	t.Cleanup(server.TearDownFn)
	client, err := kubernetes.NewForConfig(server.ClientConfig)
	if err != nil {
		t.Fatal(err)
	}
	node, err := client.CoreV1().Nodes().Create(context.Background(),
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: NodeName, Labels: map[string]string{"kubernetes.io/hostname": NodeName}}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := writeKubeconfig(server.ClientConfig, kubeconfig); err != nil {
		t.Fatal(err)
	}
	return &Cluster{Config: server.ClientConfig, Client: client, Kubeconfig: kubeconfig, Node: node}
}

// writeKubeconfig writes what a driver needs to reach the API server as the test does (the
// loopback superuser's token and the server's CA).
func writeKubeconfig(config *restclient.Config, file string) error {
	if config.BearerToken == "" || len(config.CAData) == 0 && config.CAFile == "" {
		return fmt.Errorf("the test server's client config has no token or CA")
	}
	ca := config.CAData
	if len(ca) == 0 {
		data, err := os.ReadFile(config.CAFile)
		if err != nil {
			return err
		}
		ca = data
	}
	api := clientcmdapi.NewConfig()
	api.Clusters["harness"] = &clientcmdapi.Cluster{Server: config.Host, CertificateAuthorityData: ca,
		TLSServerName: config.ServerName}
	api.AuthInfos["harness"] = &clientcmdapi.AuthInfo{Token: config.BearerToken}
	api.Contexts["harness"] = &clientcmdapi.Context{Cluster: "harness", AuthInfo: "harness"}
	api.CurrentContext = "harness"
	return clientcmd.WriteToFile(*api, file)
}
