package dra

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/kubernetes/pkg/features"
)

// allocatorFeatures are the allocator features the scheduler turns on from its feature gates
// (the scheduler's dynamicresources plugin maps them the same way), at their defaults here.
func allocatorFeatures() structured.Features {
	gate := utilfeature.DefaultFeatureGate
	return structured.Features{
		AdminAccess:          gate.Enabled(features.DRAAdminAccess),
		PrioritizedList:      gate.Enabled(features.DRAPrioritizedList),
		PartitionableDevices: gate.Enabled(features.DRAPartitionableDevices),
		DeviceTaints:         gate.Enabled(features.DRADeviceTaints),
		DeviceBindingAndStatus: gate.Enabled(features.DRADeviceBindingConditions) &&
			gate.Enabled(features.DRAResourceClaimDeviceStatus),
		ConsumableCapacity: gate.Enabled(features.DRAConsumableCapacity),
	}
}

var celCache = cel.NewCache(10, cel.Features{
	EnableConsumableCapacity: utilfeature.DefaultFeatureGate.Enabled(features.DRAConsumableCapacity),
	EnableListTypeAttributes: utilfeature.DefaultFeatureGate.Enabled(features.DRAListTypeAttributes),
})

// classLister reads DeviceClasses from the API server, as the scheduler's informer would hold them.
type classLister struct {
	client kubernetes.Interface
}

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	list, err := l.client.ResourceV1().DeviceClasses().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := make([]*resourceapi.DeviceClass, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	return l.client.ResourceV1().DeviceClasses().Get(context.Background(), name, metav1.GetOptions{})
}

// Allocate runs the scheduler's structured allocator for claims on the node, over every
// ResourceSlice in the cluster and with the devices other claims hold as allocated, as the
// scheduler's DRA plugin does. nil: the claims cannot be allocated there.
func Allocate(ctx context.Context, client kubernetes.Interface, node *v1.Node,
	claims ...*resourceapi.ResourceClaim) ([]resourceapi.AllocationResult, error) {
	sliceList, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	slices := make([]*resourceapi.ResourceSlice, len(sliceList.Items))
	for i := range sliceList.Items {
		slices[i] = &sliceList.Items[i]
	}
	claimList, err := client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	allocated := structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection()}
	for _, claim := range claimList.Items {
		if claim.Status.Allocation == nil {
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			allocated.AllocatedDevices.Insert(structured.MakeDeviceID(r.Driver, r.Pool, r.Device))
		}
	}
	allocator, err := structured.NewAllocator(ctx, allocatorFeatures(), allocated, classLister{client}, slices, celCache)
	if err != nil {
		return nil, err
	}
	return allocator.Allocate(ctx, node, claims)
}

// SelectorFor is a CEL expression that holds for a device with exactly these attributes and
// capacities (every one of them, each compared by its type), so the allocator must choose a
// device that looks like it. Unqualified names live in the driver's domain.
func SelectorFor(driver string, device resourceapi.Device) string {
	terms := []string{fmt.Sprintf("device.driver == %s", strconv.Quote(driver))}
	access := func(kind string, name resourceapi.QualifiedName) string {
		domain, id, found := strings.Cut(string(name), "/")
		if !found {
			domain, id = driver, string(name)
		}
		return fmt.Sprintf("device.%s[%s][%s]", kind, strconv.Quote(domain), strconv.Quote(id))
	}
	names := make([]string, 0, len(device.Attributes))
	for name := range device.Attributes {
		names = append(names, string(name))
	}
	sort.Strings(names)
	for _, name := range names {
		a := device.Attributes[resourceapi.QualifiedName(name)]
		field := access("attributes", resourceapi.QualifiedName(name))
		switch {
		case a.StringValue != nil:
			terms = append(terms, fmt.Sprintf("%s == %s", field, strconv.Quote(*a.StringValue)))
		case a.IntValue != nil:
			terms = append(terms, fmt.Sprintf("%s == %d", field, *a.IntValue))
		case a.BoolValue != nil:
			terms = append(terms, fmt.Sprintf("%s == %t", field, *a.BoolValue))
		case a.VersionValue != nil:
			terms = append(terms, fmt.Sprintf("%s.compareTo(semver(%s)) == 0", field, strconv.Quote(*a.VersionValue)))
		}
	}
	names = names[:0]
	for name := range device.Capacity {
		names = append(names, string(name))
	}
	sort.Strings(names)
	for _, name := range names {
		c := device.Capacity[resourceapi.QualifiedName(name)]
		terms = append(terms, fmt.Sprintf("%s.compareTo(quantity(%s)) == 0",
			access("capacity", resourceapi.QualifiedName(name)), strconv.Quote(c.Value.String())))
	}
	return strings.Join(terms, " && ")
}
