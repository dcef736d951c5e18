package llamacpp

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"
)

// EnvDevice names the environment variable that gives the default device
// policy (see DeviceMode); the CUDA image sets it to "gpu".
const EnvDevice = "PDSERVE_LLAMA_DEVICE"

// Device policies: where a model's layers and KV cache may run.
const (
	// DeviceAuto uses the GPUs llama.cpp finds, and the CPU when it finds
	// none.
	DeviceAuto = "auto"
	// DeviceGPU requires a GPU: loading a model for serving fails with
	// ErrNoGPU when llama.cpp finds none (no device, no driver, a backend
	// library that cannot load).
	DeviceGPU = "gpu"
	// DeviceCPU never uses a GPU: no GPU backend library is loaded (so a
	// node without a driver is fine) and no layer is offloaded.
	DeviceCPU = "cpu"
)

// ErrNoGPU is returned (as a *NoGPUError) when the device policy is
// DeviceGPU and llama.cpp finds no GPU.
var ErrNoGPU = errors.New("llamacpp: no GPU")

// NoGPUError is the error of a DeviceGPU load that found no GPU: one line
// saying so, what llama.cpp found instead and what to do. errors.Is(err,
// ErrNoGPU) matches it.
type NoGPUError struct {
	Dir   string       // the library directory
	Found []DeviceInfo // the devices llama.cpp did register
}

func (e *NoGPUError) Error() string {
	names := make([]string, 0, len(e.Found))
	for _, d := range e.Found {
		names = append(names, d.String())
	}
	found := "none"
	if len(names) > 0 {
		found = strings.Join(names, ", ")
	}
	return fmt.Sprintf("no GPU: llama.cpp (%s) found no GPU device, only: %s; this worker requires one (--llama-device %s, or $%s=%s as the CUDA image sets): run it on a node with a GPU and its driver, or with --llama-device %s to serve on the CPU",
		e.Dir, found, DeviceGPU, EnvDevice, DeviceGPU, DeviceCPU)
}

// Is makes errors.Is(err, ErrNoGPU) true.
func (e *NoGPUError) Is(target error) bool { return target == ErrNoGPU }

// DeviceMode returns mode, or $PDSERVE_LLAMA_DEVICE when mode is empty, or
// DeviceAuto when both are; an unknown policy is an error naming where it
// came from.
func DeviceMode(mode string) (string, error) {
	from := "device policy"
	if mode == "" {
		mode = os.Getenv(EnvDevice)
		from = "$" + EnvDevice
	}
	switch mode {
	case "":
		return DeviceAuto, nil
	case DeviceAuto, DeviceGPU, DeviceCPU:
		return mode, nil
	}
	return "", fmt.Errorf("llamacpp: %s %q: must be %s, %s or %s", from, mode, DeviceAuto, DeviceGPU, DeviceCPU)
}

// ggml_backend_dev_type values (ggml-backend.h).
const (
	devTypeCPU   = 0
	devTypeGPU   = 1
	devTypeIGPU  = 2
	devTypeAccel = 3
	devTypeMeta  = 4
)

// DeviceInfo is one device llama.cpp registered.
type DeviceInfo struct {
	Name        string // e.g. CPU, CUDA0
	Description string // e.g. the processor's or the GPU's model name
	Type        string // cpu, gpu, igpu, accel or meta
}

// GPU reports whether d is a GPU, dedicated or integrated.
func (d DeviceInfo) GPU() bool { return d.Type == "gpu" || d.Type == "igpu" }

func (d DeviceInfo) String() string {
	if d.Description == "" || d.Description == d.Name {
		return d.Name
	}
	return d.Name + " (" + d.Description + ")"
}

// devices lists the devices of the loaded backends.
func (a *api) devices() []DeviceInfo {
	n := a.devCount()
	out := make([]DeviceInfo, 0, n)
	for i := uintptr(0); i < n; i++ {
		d := a.devGet(i)
		if d == 0 {
			continue
		}
		t := "unknown"
		switch a.devType(d) {
		case devTypeCPU:
			t = "cpu"
		case devTypeGPU:
			t = "gpu"
		case devTypeIGPU:
			t = "igpu"
		case devTypeAccel:
			t = "accel"
		case devTypeMeta:
			t = "meta"
		}
		out = append(out, DeviceInfo{Name: goString(a.devName(d)), Description: strings.TrimSpace(goString(a.devDescription(d))), Type: t})
	}
	return out
}

// Devices loads llama.cpp from dir (see LibDir) with the device policy
// mode (see DeviceMode; DeviceCPU loads no GPU backend) and lists the
// devices it registered.
func Devices(dir, mode string) ([]DeviceInfo, error) {
	mode, err := DeviceMode(mode)
	if err != nil {
		return nil, err
	}
	a, err := load(LibDir(dir), "", mode == DeviceCPU)
	if err != nil {
		return nil, err
	}
	return a.devices(), nil
}

// requireGPU returns a *NoGPUError when none of the devices llama.cpp
// registered is a GPU.
func (a *api) requireGPU(dir string) error {
	ds := a.devices()
	for _, d := range ds {
		if d.GPU() {
			return nil
		}
	}
	return &NoGPUError{Dir: dir, Found: ds}
}

// noDevices is the empty, NULL-terminated device list of llama_model_params
// that keeps a model off every GPU (llama.cpp uses all GPUs when the list
// is NULL). A global, so its address is fixed for C.
var noDevices = [1]uintptr{0}

func noDevicesPtr() uintptr { return uintptr(unsafe.Pointer(&noDevices[0])) }

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
