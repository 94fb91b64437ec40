// The DRA driver's ValidatingAdmissionPolicy (plugin/deploy/gpu-dra.yaml, auto-deployed on servers)
// run by Kubernetes' own ValidatingAdmissionPolicy plugin, in the chain of policy_test.go: only
// the node a ResourceSlice of gpu.meta-gpu-k8s.io describes may create or update it; other
// drivers' slices and every delete pass (docs/dra.md, "Credentials").
package admission

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
)

const (
	draManifest = "plugin/deploy/gpu-dra.yaml"
	ourDriver   = "gpu.meta-gpu-k8s.io"
	// what the policy says when it refuses (its messageExpression); a refusal for any other reason
	// (a CEL error, another policy) does not count as the policy's
	refusal = "ResourceSlices of gpu.meta-gpu-k8s.io are written by the node they describe"
)

func draObjects(t *testing.T) []runtime.Object {
	t.Helper()
	return manifestObjects(t, draManifest, "GPU_K8S_DRA_MANIFEST")
}

// a node's credential as k3s issues it (the kubelet's client certificate): what the driver uses
func node(name string) user.Info {
	return &user.DefaultInfo{Name: "system:node:" + name, Groups: []string{"system:nodes", "system:authenticated"}}
}

func serviceAccount(namespace, name string) user.Info {
	return &user.DefaultInfo{Name: "system:serviceaccount:" + namespace + ":" + name,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}}
}

var (
	admin = &user.DefaultInfo{Name: "system:admin", Groups: []string{"system:masters", "system:authenticated"}}
	// the garbage collector where kube-controller-manager runs with --use-service-account-credentials
	// (the CIS hardening k3s documents); by default k3s runs every controller as controllerManager
	collector         = serviceAccount("kube-system", "generic-garbage-collector")
	controllerManager = &user.DefaultInfo{Name: "system:kube-controller-manager", Groups: []string{"system:authenticated"}}
	// NVIDIA's DRA driver, installed beside ours with its own (broad) RBAC on ResourceSlices
	nvidia = serviceAccount("nvidia-dra-driver-gpu", "nvidia-dra-driver-gpu-service-account-kubeletplugin")
)

// slice: one ResourceSlice as our driver publishes it (gpu_device_plugin/dra/slices.py: the node's pool, the
// Node its owner)
func slice(driver, nodeName string) *resourcev1.ResourceSlice {
	return &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName + "-" + driver + "-x7k2p", UID: "5c1b0a4e-0000-4000-8000-000000000001",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: nodeName,
				UID: "9d3f2b1c-0000-4000-8000-000000000002", Controller: ptr(true)}}},
		Spec: resourcev1.ResourceSliceSpec{Driver: driver, NodeName: ptr(nodeName),
			Pool: resourcev1.ResourcePool{Name: nodeName, Generation: 1, ResourceSliceCount: 1},
			Devices: []resourcev1.Device{{Name: "gpu-0", Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
				"productName": {StringValue: ptr("Orin (nvgpu)")}}}}},
	}
}

func ptr[T any](v T) *T { return &v }

// write runs one request for a ResourceSlice through the chain as kube-apiserver does: CREATE (old nil),
// UPDATE (both), DELETE (object nil, old the stored slice).
func (c chain) write(t *testing.T, who user.Info, op admission.Operation, object, old *resourcev1.ResourceSlice) error {
	t.Helper()
	var obj, oldObj runtime.Object
	name := ""
	if object != nil {
		obj, name = object.DeepCopy(), object.Name
	}
	if old != nil {
		oldObj, name = old.DeepCopy(), old.Name
	}
	options := map[admission.Operation]runtime.Object{admission.Create: &metav1.CreateOptions{},
		admission.Update: &metav1.UpdateOptions{}, admission.Delete: &metav1.DeleteOptions{}}[op]
	attrs := admission.NewAttributesRecord(obj, oldObj, resourcev1.SchemeGroupVersion.WithKind("ResourceSlice"), "",
		name, resourcev1.SchemeGroupVersion.WithResource("resourceslices"), "", op, options, false, who)
	return c.review(attrs)
}

func allowed(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: refused, want admitted: %v", what, err)
	}
}

// refused: by our policy, with its message naming the slice's node and the writer
func refused(t *testing.T, what string, err error, nodeName, writer string) {
	t.Helper()
	want := refusal + " (system:node:" + nodeName + " in group system:nodes), not by " + writer
	if err == nil {
		t.Errorf("%s: admitted, want refused by the policy", what)
	} else if !strings.Contains(err.Error(), want) {
		t.Errorf("%s: %v, want the policy's refusal %q", what, err, want)
	}
}

func TestTheDRAManifestHoldsTheSlicePolicyBoundToDeny(t *testing.T) {
	var policy *admissionregistrationv1.ValidatingAdmissionPolicy
	var binding *admissionregistrationv1.ValidatingAdmissionPolicyBinding
	for _, object := range draObjects(t) {
		switch o := object.(type) {
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			policy = o
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			binding = o
		}
	}
	if policy == nil || binding == nil {
		t.Fatalf("%s: want a ValidatingAdmissionPolicy and its binding (policy %v, binding %v)", draManifest,
			policy != nil, binding != nil)
	}
	if binding.Spec.PolicyName != policy.Name {
		t.Errorf("the binding names %q, the policy is %q", binding.Spec.PolicyName, policy.Name)
	}
	if *policy.Spec.FailurePolicy != admissionregistrationv1.Fail {
		t.Error("the slice policy must fail closed")
	}
	if !slices.Equal(binding.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{"Deny"}) {
		t.Errorf("validation actions %v, want [Deny]", binding.Spec.ValidationActions)
	}
	if binding.Spec.ParamRef != nil || binding.Spec.MatchResources != nil {
		t.Error("the binding must apply the policy to every slice, without parameters")
	}
}

func TestANodeWritesItsOwnSlices(t *testing.T) {
	c := startChain(t, draObjects(t))
	mine := slice(ourDriver, "orin-1")
	allowed(t, "create by its node", c.write(t, node("orin-1"), admission.Create, mine, nil))
	// the driver's republish: a new generation, a GPU's health taint, a device more
	next := mine.DeepCopy()
	next.Spec.Pool.Generation = 2
	next.Spec.Devices = append(next.Spec.Devices, resourcev1.Device{Name: "gpu-1"})
	allowed(t, "update by its node", c.write(t, node("orin-1"), admission.Update, next, mine))
	// a node not yet known to the API server when the driver starts publishes without an owner
	orphan := slice(ourDriver, "orin-1")
	orphan.OwnerReferences = nil
	allowed(t, "create without an owner by its node", c.write(t, node("orin-1"), admission.Create, orphan, nil))
}

func TestANodeCannotWriteAnotherNodesSlices(t *testing.T) {
	c := startChain(t, draObjects(t))
	theirs := slice(ourDriver, "orin-1")
	refused(t, "create for orin-1 by thor-1", c.write(t, node("thor-1"), admission.Create, theirs, nil),
		"orin-1", "system:node:thor-1")
	// nothing changed but the writer
	refused(t, "unchanged update of orin-1's slice by thor-1",
		c.write(t, node("thor-1"), admission.Update, theirs, theirs), "orin-1", "system:node:thor-1")
	grown := theirs.DeepCopy()
	grown.Spec.Devices = append(grown.Spec.Devices, resourcev1.Device{Name: "gpu-9"})
	refused(t, "a device added to orin-1's slice by thor-1", c.write(t, node("thor-1"), admission.Update, grown, theirs),
		"orin-1", "system:node:thor-1")
}

func TestNoOtherIdentityWritesOurSlices(t *testing.T) {
	c := startChain(t, draObjects(t))
	ours := slice(ourDriver, "orin-1")
	grown := ours.DeepCopy()
	grown.Spec.Devices = append(grown.Spec.Devices, resourcev1.Device{Name: "gpu-9"})
	for _, who := range []user.Info{
		admin, // system:masters passes authorization, not admission
		serviceAccount("default", "ci-runner"),
		nvidia,
		collector,
		controllerManager,
		&user.DefaultInfo{Name: "alice", Groups: []string{"system:authenticated"}},
		// a node's name outside group system:nodes (a client certificate another signer issued): the
		// Node authorizer and NodeRestriction do not take it for the node, nor does the policy
		&user.DefaultInfo{Name: "system:node:orin-1", Groups: []string{"system:authenticated"}},
		&user.DefaultInfo{Name: "system:node:orin-1"},
	} {
		label := fmt.Sprintf("%s %v", who.GetName(), who.GetGroups())
		refused(t, "create by "+label, c.write(t, who, admission.Create, ours, nil), "orin-1", who.GetName())
		refused(t, "update by "+label, c.write(t, who, admission.Update, grown, ours), "orin-1", who.GetName())
		refused(t, "unchanged update by "+label, c.write(t, who, admission.Update, ours, ours), "orin-1", who.GetName())
	}
	// a slice of ours that names no node (every node, a node selector) is nobody's to write, not even a node's
	everywhere := slice(ourDriver, "orin-1")
	everywhere.Spec.NodeName, everywhere.Spec.AllNodes = nil, ptr(true)
	refused(t, "an all-nodes slice by a node", c.write(t, node("orin-1"), admission.Create, everywhere, nil),
		"<no nodeName>", "system:node:orin-1")
	refused(t, "an all-nodes slice by an admin", c.write(t, admin, admission.Create, everywhere, nil),
		"<no nodeName>", admin.Name)
}

func TestOtherDriversSlicesAreLeftAlone(t *testing.T) {
	c := startChain(t, draObjects(t))
	for _, who := range []user.Info{nvidia, admin, node("thor-1")} {
		theirs := slice("gpu.nvidia.com", "orin-1")
		allowed(t, "NVIDIA's slice created by "+who.GetName(), c.write(t, who, admission.Create, theirs, nil))
		next := theirs.DeepCopy()
		next.Spec.Pool.Generation = 2
		allowed(t, "NVIDIA's slice updated by "+who.GetName(), c.write(t, who, admission.Update, next, theirs))
	}
	// a driver whose name only starts or ends like ours is another driver
	for _, driver := range []string{"gpu.meta-gpu-k8s.io.example.com", "dgpu.gpu.meta-gpu-k8s.io"} {
		allowed(t, driver+"'s slice created by "+admin.Name,
			c.write(t, admin, admission.Create, slice(driver, "orin-1"), nil))
	}
}

func TestDeletesOfOurSlicesAreNotBlocked(t *testing.T) {
	c := startChain(t, draObjects(t))
	ours := slice(ourDriver, "orin-1")
	// the kubelet wipes its node's slices of a driver gone (and at its start), the garbage collector a
	// deleted Node's, an admin cleans up; another node is held off by the Node authorizer, not here
	for _, who := range []user.Info{node("orin-1"), collector, controllerManager, admin, node("thor-1")} {
		allowed(t, "delete by "+who.GetName(), c.write(t, who, admission.Delete, nil, ours))
	}
}

// A Node deleted with propagationPolicy Orphan keeps its "orphan" finalizer until the garbage collector
// has taken its owner reference off every dependent, by a patch: an UPDATE by the collector, which the
// policy must let through or the Node's deletion never ends. Nothing else passes with it.
func TestTheGarbageCollectorMayOnlyTakeTheNodesOwnerReferenceOff(t *testing.T) {
	c := startChain(t, draObjects(t))
	ours := slice(ourDriver, "orin-1")
	orphaned := ours.DeepCopy()
	orphaned.OwnerReferences = nil
	orphaned.ResourceVersion = "8"
	orphaned.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: "Update"}}
	for _, who := range []user.Info{collector, controllerManager} {
		allowed(t, who.GetName()+" orphaning a slice", c.write(t, who, admission.Update, orphaned, ours))
	}
	// one of two owners taken off (the driver sets one; someone may have added another)
	two := ours.DeepCopy()
	two.OwnerReferences = append(two.OwnerReferences, metav1.OwnerReference{APIVersion: "v1", Kind: "Node",
		Name: "orin-1-old", UID: "9d3f2b1c-0000-4000-8000-000000000003"})
	allowed(t, "the collector taking one of two owners off", c.write(t, collector, admission.Update, ours, two))

	withDevice := orphaned.DeepCopy()
	withDevice.Spec.Devices = append(withDevice.Spec.Devices, resourcev1.Device{Name: "gpu-9"})
	refused(t, "owner taken off and a device added", c.write(t, collector, admission.Update, withDevice, ours),
		"orin-1", collector.GetName())
	swapped := ours.DeepCopy()
	swapped.OwnerReferences[0].UID = "9d3f2b1c-0000-4000-8000-000000000004"
	replaced := two.DeepCopy()
	replaced.OwnerReferences = swapped.OwnerReferences
	refused(t, "two owners replaced by a new one", c.write(t, admin, admission.Update, replaced, two), "orin-1",
		admin.Name)
	refused(t, "an owner added", c.write(t, admin, admission.Update, two, ours), "orin-1", admin.Name)
	refused(t, "an owner-less slice updated unchanged", c.write(t, admin, admission.Update, orphaned, orphaned),
		"orin-1", admin.Name)
	refused(t, "an owner taken off at creation", c.write(t, collector, admission.Create, orphaned, nil),
		"orin-1", collector.GetName())
}
