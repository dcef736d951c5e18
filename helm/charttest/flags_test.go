package charttest

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// binaryFlags builds a pdserve binary's flag set exactly as its main does
// (the same Options constructor and AddFlags), and returns it with a
// function that completes and validates the options the flag set parsed
// into. The validate function reads files the options name (the
// coordinator's --config) through files, which maps the paths the
// container mounts to their rendered content, and may write scratch files
// in tmp.
type binaryFlags func() (fs *flag.FlagSet, validate func(files mountedFiles, tmp string) error)

// mountedFiles maps a path inside a container to the content the release
// mounts there; a path absent from it comes from a Secret the user
// provides, or does not exist.
type mountedFiles map[string]string

// binaries maps a container name of the chart to its binary's flags.
var binaries = map[string]binaryFlags{
	"coordinator": func() (*flag.FlagSet, func(mountedFiles, string) error) {
		o := coordinator.DefaultOptions()
		fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
		o.AddFlags(fs)
		return fs, func(files mountedFiles, tmp string) error {
			if o.ConfigFile != "" {
				content, ok := files[o.ConfigFile]
				if !ok {
					return fmt.Errorf("--config=%s: nothing of the release is mounted there", o.ConfigFile)
				}
				path := filepath.Join(tmp, "policy.yaml")
				if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
					return err
				}
				o.ConfigFile = path
			}
			if err := o.Complete(); err != nil {
				return err
			}
			return o.Validate()
		}
	},
	"prefill-worker": func() (*flag.FlagSet, func(mountedFiles, string) error) {
		o := workerrun.NewPrefillOptions()
		fs := flag.NewFlagSet("prefill-worker", flag.ContinueOnError)
		o.AddFlags(fs)
		return fs, func(mountedFiles, string) error { return o.Validate() }
	},
	"decode-worker": func() (*flag.FlagSet, func(mountedFiles, string) error) {
		o := workerrun.NewDecodeOptions()
		fs := flag.NewFlagSet("decode-worker", flag.ContinueOnError)
		o.AddFlags(fs)
		return fs, func(mountedFiles, string) error { return o.Validate() }
	},
}

// sampleEnv holds plausible values of the downward-API variables the chart
// puts into args, standing in for what the kubelet substitutes.
var sampleEnv = map[string]string{
	"POD_NAME":      "pd-pdserve-prefill-5d8f7c9b4-x2k9q",
	"POD_NAMESPACE": "pdserve",
	"POD_IP":        "10.1.2.3",
	"NATS_URL":      "nats://pd-pdserve-nats:4222",
}

var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expandArgs substitutes $(VAR) references as the kubelet does, with the
// container's literal env values or sampleEnv for values from elsewhere.
// A reference to a variable the container does not define is an error: the
// kubelet would pass it through literally.
func expandArgs(c corev1.Container) ([]string, error) {
	defined := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			defined[e.Name] = e.Value
		case sampleEnv[e.Name] != "":
			defined[e.Name] = sampleEnv[e.Name]
		default:
			defined[e.Name] = "value-of-" + e.Name
		}
	}
	out := make([]string, len(c.Args))
	var err error
	for i, a := range c.Args {
		out[i] = envRef.ReplaceAllStringFunc(a, func(ref string) string {
			name := envRef.FindStringSubmatch(ref)[1]
			v, ok := defined[name]
			if !ok && err == nil {
				err = fmt.Errorf("arg %q refers to $(%s), which the container does not define", a, name)
			}
			return v
		})
	}
	return out, err
}

// checkArgs parses a container's args with its binary's own flag set. Every
// arg must be one --name=value (so that no value is mistaken for a flag),
// name a flag the binary defines, appear once, and leave no positional
// arguments. It returns the parsed flag values by name, and the error of
// the options' validation separately (nil when they are valid).
func checkArgs(newFlags binaryFlags, args []string, files mountedFiles, tmp string) (values map[string]string, invalid error, err error) {
	seen := map[string]bool{}
	for _, a := range args {
		name, _, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !ok {
			return nil, nil, fmt.Errorf("arg %q is not --name=value", a)
		}
		if seen[name] {
			return nil, nil, fmt.Errorf("flag --%s given twice", name)
		}
		seen[name] = true
	}
	fs, validate := newFlags()
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		return nil, nil, fmt.Errorf("%s rejects %s: %w", fs.Name(), quoteAll(args), err)
	}
	if fs.NArg() != 0 {
		return nil, nil, fmt.Errorf("%s: positional arguments %q", fs.Name(), fs.Args())
	}
	values = map[string]string{}
	fs.Visit(func(f *flag.Flag) { values[f.Name] = f.Value.String() })
	return values, validate(files, tmp), nil
}

// hasFlag reports whether a binary defines the flag name.
func hasFlag(newFlags binaryFlags, name string) bool {
	fs, _ := newFlags()
	return fs.Lookup(name) != nil
}

// mounts returns the files the release mounts into container c of spec:
// every key of a ConfigMap or Secret volume the release renders, at
// mountPath/key.
func (r release) mounts(spec *corev1.PodSpec, c corev1.Container) mountedFiles {
	files := mountedFiles{}
	vols := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		vols[v.Name] = v
	}
	for _, m := range c.VolumeMounts {
		v := vols[m.Name]
		var data map[string]string
		switch {
		case v.ConfigMap != nil:
			if cm, ok := r.find("ConfigMap", v.ConfigMap.Name).(*corev1.ConfigMap); ok {
				data = cm.Data
			}
		case v.Secret != nil:
			if s, ok := r.find("Secret", v.Secret.SecretName).(*corev1.Secret); ok {
				data = map[string]string{}
				for k, b := range s.Data {
					data[k] = string(b)
				}
				for k, v := range s.StringData {
					data[k] = v
				}
			}
		}
		for k, content := range data {
			files[filepath.Join(m.MountPath, k)] = content
		}
	}
	return files
}
