// The server image's admission policies, run by Kubernetes' own MutatingAdmissionPolicy and
// ValidatingAdmissionPolicy plugins (k8s.io/apiserver at the release k3s v1.36.4+k3s1 carries) the
// way kube-apiserver runs them: policies and bindings read through informers, the pod's namespace
// looked up, the mutating plugin first, the validating one on its result. Only the API server's
// storage is a fake (client-go's fake clientset); the CEL, the JSON patches and the decisions are the
// real code's.
package admission

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/discovery"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/openapi"
	"k8s.io/client-go/openapi/openapitest"
	admissionregistrationdefaults "k8s.io/kubernetes/pkg/apis/admissionregistration/v1"
)

const (
	manifest  = "meta-gpu-k8s/recipes-containers/gpu-k8s-k3s-config/files/gpu-k8s-nvidia-feature-variables.yaml"
	tenant    = "tenant"
	exempt    = "storage-team"
	exemption = "gpu-k8s.io/nvidia-feature-variables"
)

var features = []string{"NVIDIA_GDS", "NVIDIA_MOFED", "NVIDIA_GDRCOPY", "NVIDIA_NVSWITCH"}

// policyObjects decodes the feature-variable manifest k3s applies: every document, typed.
func policyObjects(t *testing.T) []runtime.Object {
	t.Helper()
	return manifestObjects(t, manifest, "GPU_K8S_ADMISSION_MANIFEST")
}

// manifestObjects decodes a manifest of the repository (the file the environment variable override
// names, if set): every document, typed.
func manifestObjects(t *testing.T, manifest, override string) []runtime.Object {
	t.Helper()
	path := os.Getenv(override)
	if path == "" {
		// go test runs in this package's directory, two below the repository's root
		repo := os.Getenv("CONFORMANCE_REPO")
		if repo == "" {
			repo = filepath.Join("..", "..")
		}
		path = filepath.Join(repo, manifest)
	}
	raw, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		t.Fatal(err)
	}
	var objects []runtime.Object
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		json, err := utilyaml.ToJSON([]byte(doc))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		object, _, err := scheme.Codecs.UniversalDeserializer().Decode(json, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		defaults.Default(object)
		objects = append(objects, object)
	}
	return objects
}

// defaults holds kube-apiserver's defaulting of admission objects (what it applies when k3s creates
// them): a policy leaving out matchPolicy or its selectors gets them as on a server (a nil selector
// would make the plugin refuse every request), not as written.
var defaults = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := admissionregistrationdefaults.RegisterDefaults(s); err != nil {
		panic(err)
	}
	return s
}()

// The policies' type converter comes from the API server's OpenAPI document; the fake clientset has
// none, so the embedded copy client-go keeps for tests stands in for it.
type withOpenAPI struct{ discovery.DiscoveryInterface }

func (withOpenAPI) OpenAPIV3() openapi.Client { return openapitest.NewEmbeddedFileClient() }

type clientset struct{ *fake.Clientset }

func (c clientset) Discovery() discovery.DiscoveryInterface {
	return withOpenAPI{c.Clientset.Discovery()}
}

type chain struct {
	mutate   *mutating.Plugin
	validate *validating.Plugin
}

// newChain: the feature-variable policies, a tenant's namespace and an exempt one.
func newChain(t *testing.T) chain {
	t.Helper()
	return startChain(t, append(policyObjects(t),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenant}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: exempt, Labels: map[string]string{exemption: "allowed"}}}))
}

// startChain: both plugins, initialised as kube-apiserver does, over a cluster holding these objects.
func startChain(t *testing.T, objects []runtime.Object) chain {
	t.Helper()
	client := clientset{fake.NewClientset(objects...)}
	factory := informers.NewSharedInformerFactory(client, 0)
	mapper := meta.NewDefaultRESTMapper(nil)
	mapper.Add(corev1.SchemeGroupVersion.WithKind("Pod"), meta.RESTScopeNamespace)
	mapper.Add(resourcev1.SchemeGroupVersion.WithKind("ResourceSlice"), meta.RESTScopeRoot)
	dynamic := dynamicfake.NewSimpleDynamicClient(scheme.Scheme)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })

	mutate, err := mutating.NewPlugin(nil)
	if err != nil {
		t.Fatal(err)
	}
	validate, err := validating.NewPlugin(nil)
	if err != nil {
		t.Fatal(err)
	}
	// what kube-apiserver's admission initializers hand every plugin
	mutate.SetExternalKubeClientSet(client)
	validate.SetExternalKubeClientSet(client)
	mutate.SetExternalKubeInformerFactory(factory)
	validate.SetExternalKubeInformerFactory(factory)
	mutate.SetRESTMapper(mapper)
	validate.SetRESTMapper(mapper)
	mutate.SetDynamicClient(dynamic)
	validate.SetDynamicClient(dynamic)
	mutate.SetDrainedNotification(stop)
	validate.SetDrainedNotification(stop)
	mutate.SetAuthorizer(authorizerfactory.NewAlwaysAllowAuthorizer())
	validate.SetAuthorizer(authorizerfactory.NewAlwaysAllowAuthorizer())
	mutate.InspectFeatureGates(utilfeature.DefaultFeatureGate) // GA in 1.36: on by default (the validating one always is)
	if err := mutate.ValidateInitialization(); err != nil {
		t.Fatal(err)
	}
	if err := validate.ValidateInitialization(); err != nil {
		t.Fatal(err)
	}
	factory.Start(stop)
	factory.WaitForCacheSync(stop)
	// ready once both have read the policies, bindings and namespaces
	deadline := time.Now().Add(30 * time.Second)
	for !(mutate.WaitForReady() && validate.WaitForReady()) {
		if time.Now().After(deadline) {
			t.Fatal("admission plugins not ready after 30 s")
		}
	}
	return chain{mutate, validate}
}

// admit runs the pod's CREATE through the chain as kube-apiserver does; returns the pod as stored, or the error.
func (c chain) admit(t *testing.T, namespace string, pod *corev1.Pod) (*corev1.Pod, error) {
	t.Helper()
	pod = pod.DeepCopy()
	pod.Namespace = namespace
	attrs := admission.NewAttributesRecord(pod, nil, corev1.SchemeGroupVersion.WithKind("Pod"), namespace, pod.Name,
		corev1.SchemeGroupVersion.WithResource("pods"), "", admission.Create, &metav1.CreateOptions{}, false,
		&user.DefaultInfo{Name: "tenant-user"})
	if err := c.review(attrs); err != nil {
		return nil, err
	}
	return attrs.GetObject().(*corev1.Pod), nil
}

// review runs one request through the chain: the mutating plugin, then the validating one on its result.
func (c chain) review(attrs admission.Attributes) error {
	interfaces := admission.NewObjectInterfacesFromScheme(scheme.Scheme)
	ctx := context.Background()
	if err := c.mutate.Admit(ctx, attrs, interfaces); err != nil {
		return err
	}
	return c.validate.Validate(ctx, attrs, interfaces)
}

func gpuContainer(name string, env ...corev1.EnvVar) corev1.Container {
	return corev1.Container{Name: name, Image: "nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04", Env: env,
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}
}

func pod(containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "job"}, Spec: corev1.PodSpec{Containers: containers}}
}

func value(name, v string) corev1.EnvVar { return corev1.EnvVar{Name: name, Value: v} }

func env(c corev1.Container) map[string][]string {
	out := map[string][]string{}
	for _, e := range c.Env {
		out[e.Name] = append(out[e.Name], e.Value)
	}
	return out
}

// allDisabled: the container's own env now says "disabled" for each feature variable, once.
func allDisabled(t *testing.T, c corev1.Container) {
	t.Helper()
	got := env(c)
	for _, name := range features {
		if !slices.Equal(got[name], []string{"disabled"}) {
			t.Errorf("container %s: %s = %v, want exactly [disabled] (env %v)", c.Name, name, got[name], c.Env)
		}
	}
}

func untouched(t *testing.T, before *corev1.Pod, after *corev1.Pod) {
	t.Helper()
	for i := range before.Spec.Containers {
		if !slices.EqualFunc(before.Spec.Containers[i].Env, after.Spec.Containers[i].Env,
			func(a, b corev1.EnvVar) bool { return a.Name == b.Name && a.Value == b.Value }) {
			t.Errorf("container %s changed: %v -> %v", before.Spec.Containers[i].Name,
				before.Spec.Containers[i].Env, after.Spec.Containers[i].Env)
		}
	}
}

func TestTheManifestHoldsBothPoliciesAndTheirBindings(t *testing.T) {
	var kinds []string
	for _, object := range policyObjects(t) {
		switch o := object.(type) {
		case *admissionregistrationv1.MutatingAdmissionPolicy:
			kinds = append(kinds, "MutatingAdmissionPolicy")
			if *o.Spec.FailurePolicy != admissionregistrationv1.Fail {
				t.Error("the mutating policy must fail closed")
			}
		case *admissionregistrationv1.MutatingAdmissionPolicyBinding:
			kinds = append(kinds, "MutatingAdmissionPolicyBinding")
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			kinds = append(kinds, "ValidatingAdmissionPolicy")
			if *o.Spec.FailurePolicy != admissionregistrationv1.Fail {
				t.Error("the validating policy must fail closed")
			}
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			kinds = append(kinds, "ValidatingAdmissionPolicyBinding")
			if !slices.Equal(o.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{"Deny"}) {
				t.Errorf("validation actions %v, want [Deny]", o.Spec.ValidationActions)
			}
		default:
			t.Errorf("unexpected object %T", object)
		}
	}
	want := []string{"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy",
		"ValidatingAdmissionPolicyBinding"}
	if !slices.Equal(kinds, want) {
		t.Errorf("kinds %v, want %v", kinds, want)
	}
}

func TestAGPUPodThatEnablesAFeatureVariableIsRefused(t *testing.T) {
	c := newChain(t)
	for _, name := range features {
		_, err := c.admit(t, tenant, pod(gpuContainer("trainer", value(name, "enabled"))))
		if err == nil || !strings.Contains(err.Error(), "container trainer may be handed a GPU and is not privileged") ||
			!strings.Contains(err.Error(), name) {
			t.Errorf("%s=enabled: %v", name, err)
		}
	}
	// a value the API server cannot see is refused too
	fromConfigMap := corev1.EnvVar{Name: "NVIDIA_MOFED", ValueFrom: &corev1.EnvVarSource{
		ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"},
			Key: "mofed"}}}
	if _, err := c.admit(t, tenant, pod(gpuContainer("trainer", fromConfigMap))); err == nil {
		t.Error("NVIDIA_MOFED from a ConfigMap key was admitted")
	}
	// and in an init container, which gets its own GPU
	withInit := pod(corev1.Container{Name: "app", Image: "busybox"})
	withInit.Spec.InitContainers = []corev1.Container{gpuContainer("warmup", value("NVIDIA_GDRCOPY", "enabled"))}
	if _, err := c.admit(t, tenant, withInit); err == nil || !strings.Contains(err.Error(), "container warmup") {
		t.Errorf("an init container's NVIDIA_GDRCOPY=enabled: %v", err)
	}
}

func TestAGPUPodIsAdmittedWithEveryFeatureVariableDisabledInItsOwnEnv(t *testing.T) {
	c := newChain(t)
	// nothing set: the whole env is written (it beats the image's ENV and the device plugin's)
	admitted, err := c.admit(t, tenant, pod(gpuContainer("trainer")))
	if err != nil {
		t.Fatal(err)
	}
	allDisabled(t, admitted.Spec.Containers[0])
	// envFrom may carry NVIDIA_MOFED=enabled from a ConfigMap the API server never sees: the container's own
	// env beats envFrom (kubelet makeEnvironmentVariables), so it gets the variables written out
	withEnvFrom := gpuContainer("trainer", value("EPOCHS", "3"), value("NVIDIA_GDS", "disabled"))
	withEnvFrom.EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}}
	admitted, err = c.admit(t, tenant, pod(withEnvFrom))
	if err != nil {
		t.Fatal(err)
	}
	got := admitted.Spec.Containers[0]
	allDisabled(t, got)
	if got.Env[0] != value("EPOCHS", "3") || got.Env[1] != value("NVIDIA_GDS", "disabled") || len(got.Env) != 5 {
		t.Errorf("the container's own entries must stay first and unchanged, got %v", got.Env)
	}
	// a time-sliced GPU (renamed resource) and a DRA claim are GPUs too; the second container only
	shared := gpuContainer("sliced")
	shared.Resources.Limits = corev1.ResourceList{"nvidia.com/gpu.shared": resource.MustParse("1")}
	claimed := corev1.Container{Name: "dra", Image: "busybox", Resources: corev1.ResourceRequirements{
		Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}
	admitted, err = c.admit(t, tenant, pod(corev1.Container{Name: "sidecar", Image: "busybox"}, shared, claimed))
	if err != nil {
		t.Fatal(err)
	}
	if len(admitted.Spec.Containers[0].Env) != 0 {
		t.Errorf("a container without a GPU was changed: %v", admitted.Spec.Containers[0].Env)
	}
	allDisabled(t, admitted.Spec.Containers[1])
	allDisabled(t, admitted.Spec.Containers[2])
	// init containers are patched at their own path
	withInit := pod(corev1.Container{Name: "app", Image: "busybox"})
	withInit.Spec.InitContainers = []corev1.Container{gpuContainer("warmup")}
	admitted, err = c.admit(t, tenant, withInit)
	if err != nil {
		t.Fatal(err)
	}
	allDisabled(t, admitted.Spec.InitContainers[0])
}

func TestPrivilegedContainersPodsWithoutAGPUAndExemptNamespacesAreLeftAlone(t *testing.T) {
	c := newChain(t)
	privileged := gpuContainer("dcgm", value("NVIDIA_MOFED", "enabled"))
	yes := true
	privileged.SecurityContext = &corev1.SecurityContext{Privileged: &yes}
	sysAdmin := gpuContainer("gds", value("NVIDIA_GDS", "enabled"))
	sysAdmin.SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{
		Add: []corev1.Capability{"sys_admin"}}} // containerd and docker take it in any case, with or without CAP_
	noGPU := corev1.Container{Name: "web", Image: "busybox", Env: []corev1.EnvVar{value("NVIDIA_MOFED", "enabled")}}
	for _, case_ := range []struct {
		namespace string
		pod       *corev1.Pod
	}{
		{tenant, pod(privileged)},
		{tenant, pod(sysAdmin)},
		{tenant, pod(noGPU)},
		{exempt, pod(gpuContainer("rdma", value("NVIDIA_MOFED", "enabled")))},
	} {
		admitted, err := c.admit(t, case_.namespace, case_.pod)
		if err != nil {
			t.Errorf("%s/%s: %v", case_.namespace, case_.pod.Spec.Containers[0].Name, err)
			continue
		}
		untouched(t, case_.pod, admitted)
	}
}
