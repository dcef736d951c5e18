package llamacpp

import (
	"errors"
	"os"
	"strings"
	"testing"
)

func TestDeviceMode(t *testing.T) {
	for _, tc := range []struct {
		flag, env string
		want      string
		wantErr   string
	}{
		{"", "", DeviceAuto, ""},
		{"", "gpu", DeviceGPU, ""},
		{"cpu", "gpu", DeviceCPU, ""},
		{"auto", "cpu", DeviceAuto, ""},
		{"cuda", "", "", `device policy "cuda": must be auto, gpu or cpu`},
		{"", "GPU", "", `$PDSERVE_LLAMA_DEVICE "GPU": must be auto, gpu or cpu`},
	} {
		t.Run(tc.flag+"/"+tc.env, func(t *testing.T) {
			t.Setenv(EnvDevice, tc.env)
			got, err := DeviceMode(tc.flag)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("DeviceMode(%q) with $%s=%q: %v, want an error with %q", tc.flag, EnvDevice, tc.env, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("DeviceMode(%q) with $%s=%q = %q, %v; want %q", tc.flag, EnvDevice, tc.env, got, err, tc.want)
			}
		})
	}
}

// TestDeviceGPURequired: on the CPU build, which has no GPU backend, a
// model loaded for serving with the gpu policy (from the option or from
// $PDSERVE_LLAMA_DEVICE) fails with ErrNoGPU in one line that says what
// llama.cpp found and what to do; loading only the vocabulary (the
// coordinator's tokenizer) does not need a GPU.
func TestDeviceGPURequired(t *testing.T) {
	path, lib := testModel(t, "llama-f32")
	ds, err := Devices(lib, DeviceAuto)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("devices: %v", ds)
	for _, d := range ds {
		if d.GPU() {
			t.Skipf("this llama.cpp finds a GPU (%v): nothing to refuse", d)
		}
	}
	if len(ds) == 0 || ds[0].Type != "cpu" {
		t.Fatalf("devices %v: want the CPU first", ds)
	}
	for _, tc := range []struct {
		name, opt, env string
	}{
		{"option", DeviceGPU, ""},
		{"environment", "", DeviceGPU},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EnvDevice, tc.env)
			m, err := LoadModel(path, LoadOptions{LibDir: lib, Device: tc.opt, CPUVariant: os.Getenv(envTestVariant)})
			if err == nil {
				m.Close()
				t.Fatal("LoadModel with the gpu policy and no GPU succeeded")
			}
			var ng *NoGPUError
			if !errors.Is(err, ErrNoGPU) || !errors.As(err, &ng) {
				t.Fatalf("error %v: want a *NoGPUError matching ErrNoGPU", err)
			}
			msg := err.Error()
			for _, want := range []string{"no GPU: ", "found no GPU device, only: CPU", "--llama-device cpu"} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q lacks %q", msg, want)
				}
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("error %q: want one line", msg)
			}
			v, err := LoadModel(path, LoadOptions{LibDir: lib, Device: tc.opt, VocabOnly: true, CPUVariant: os.Getenv(envTestVariant)})
			if err != nil {
				t.Fatalf("vocabulary only, gpu policy: %v", err)
			}
			v.Close()
		})
	}
}

// TestDeviceCPU: the cpu policy serves, and its logits are those of the
// default policy on this (GPU-less) machine: the same CPU backend runs
// both.
func TestDeviceCPU(t *testing.T) {
	path, lib := testModel(t, "llama-f32")
	prompt := [][]int32{{1, 15043, 3186, 29892, 920, 526, 366}}
	want := prefillMix(t, newTestEngine(t, "llama-f32", nil), prompt, 0)
	t.Setenv(EnvDevice, DeviceGPU) // the option wins over the environment
	m, err := LoadModel(path, LoadOptions{LibDir: lib, Device: DeviceCPU, GPULayers: -1, CPUVariant: os.Getenv(envTestVariant)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	e, err := NewOnModel(m, Options{CtxSize: 512, Threads: 1, MaxSeqs: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	got := prefillMix(t, e, prompt, 0)
	if d := maxDiff(got[0], want[0]); d != 0 {
		t.Errorf("cpu policy logits differ from the default's by %g", d)
	}
}
