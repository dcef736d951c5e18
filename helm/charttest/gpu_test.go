package charttest

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestGPUResource: gpuResource names the resource the workers request
// their pool's gpus of (amd.com/gpu for a ROCm build), in requests and
// limits, with no nvidia.com/gpu left; the coordinator requests none; and
// a pool's resources that name the GPU resource themselves are refused,
// since they would bypass gpus.
func TestGPUResource(t *testing.T) {
	for _, tc := range []struct {
		name, base, over string
		res              corev1.ResourceName
		gpus             map[string]int64 // Deployment → GPUs per pod
	}{
		{"nvidia by default", "gpu-two-pools", `{}`, "nvidia.com/gpu", map[string]int64{prefillName: 2, decodeName: 2, coordinatorName: 0}},
		{"amd for ROCm", "gpu-two-pools", `gpuResource: amd.com/gpu`, "amd.com/gpu", map[string]int64{prefillName: 2, decodeName: 2, coordinatorName: 0}},
		{"intel, llamacpp", "llamacpp-gpu", `gpuResource: gpu.intel.com/xe`, "gpu.intel.com/xe", map[string]int64{prefillName: 1, decodeName: 1, coordinatorName: 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := renderOver(t, tc.base, tc.over)
			if got := r.gpuResource(); got != tc.res {
				t.Fatalf("gpuResource %q, want %q", got, tc.res)
			}
			checkGPUs(t, r)
			for name, n := range tc.gpus {
				c := r.deployment(t, name).Spec.Template.Spec.Containers[0]
				want := *resource.NewQuantity(n, resource.DecimalSI)
				for kind, list := range map[string]corev1.ResourceList{"limits": c.Resources.Limits, "requests": c.Resources.Requests} {
					q, ok := list[tc.res]
					if n == 0 && ok || n > 0 && (!ok || q.Cmp(want) != 0) {
						t.Errorf("%s: %s %s = %v, want %d", name, kind, tc.res, q.String(), n)
					}
					if other := corev1.ResourceName("nvidia.com/gpu"); other != tc.res {
						if _, ok := list[other]; ok {
							t.Errorf("%s: %s still name %s", name, kind, other)
						}
					}
				}
			}
		})
	}
	ch := loadChart(t)
	for _, tc := range []struct{ name, values, want string }{
		{"a vendor the schema does not list, in a pool's resources", `
gpuResource: example.com/accelerator
decodeWorker: {resources: {limits: {example.com/accelerator: 1}}}`, "decode: resources.limits names example.com/accelerator: set the pool's gpus instead"},
		{"a name without a domain", `gpuResource: gpu`, "gpuResource"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := renderError(t, ch, tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("render error %v, want one saying %q", err, tc.want)
			}
		})
	}
}
