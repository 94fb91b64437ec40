// Compiles CEL device selectors with the scheduler's own compiler (k8s.io/dynamic-resource-allocation/cel,
// 1.36's features: consumable capacity on) and evaluates each against each device. Reads JSON on stdin:
// {"expressions": ["..."], "devices": [{"driver": "...", "device": <resource.k8s.io/v1 Device>}]};
// writes {"errors": {expression: compile error}, "matches": [[bool per device] per expression]}.
// tests/plugin/test_dra_cel.py runs it on the DeviceClasses, the README's selectors and our devices.
package main

import (
	"context"
	"encoding/json"
	"os"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
)

type input struct {
	Expressions []string `json:"expressions"`
	Devices     []struct {
		Driver string             `json:"driver"`
		Device resourceapi.Device `json:"device"`
	} `json:"devices"`
}

func main() {
	var in input
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		panic(err)
	}
	compiler := cel.GetCompiler(cel.Features{EnableConsumableCapacity: true})
	out := map[string]any{"errors": map[string]string{}, "matches": [][]any{}}
	for _, expression := range in.Expressions {
		result := compiler.CompileCELExpression(expression, cel.Options{})
		row := []any{}
		if result.Error != nil {
			out["errors"].(map[string]string)[expression] = result.Error.Error()
		} else {
			for _, d := range in.Devices {
				matched, _, err := result.DeviceMatches(context.Background(), cel.Device{
					Driver: d.Driver, AllowMultipleAllocations: d.Device.AllowMultipleAllocations,
					Attributes: d.Device.Attributes, Capacity: d.Device.Capacity})
				if err != nil {
					row = append(row, err.Error())
				} else {
					row = append(row, matched)
				}
			}
		}
		out["matches"] = append(out["matches"].([][]any), row)
	}
	_ = json.NewEncoder(os.Stdout).Encode(out)
}
