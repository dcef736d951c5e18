package charttest

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/grpcnet"
	"github.com/pdserve/pdserve/pkg/grpcnet/tlstest"
	"github.com/pdserve/pdserve/pkg/plannerhost"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// binaryFlags builds a pdserve binary's flag set exactly as its main does
// (the same Options constructor and AddFlags), and returns it with a
// function that completes and validates the options the flag set parsed
// into. The validate function reads files the options name (the
// coordinator's --policy, every binary's --tls-cert, --tls-key, --tls-ca
// and --model) through files, which maps the paths the container mounts
// to their content, writing them as scratch files in tmp.
type binaryFlags func() (fs *flag.FlagSet, validate func(files mountedFiles, tmp string) error)

// mountedFiles maps a path inside a container to the content the release
// mounts there; a path absent from it comes from a Secret the user
// provides, or does not exist.
type mountedFiles map[string]string

// binaries maps a container name of the chart to its binary's flags.
var binaries = map[string]binaryFlags{
	"coordinator": func() (*flag.FlagSet, func(mountedFiles, string) error) {
		o := coordinator.DefaultOptions()
		po := plannerhost.DefaultOptions()
		fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
		o.AddFlags(fs)
		po.AddFlags(fs) // the binary's flags: coordinatorrun registers both
		return fs, func(files mountedFiles, tmp string) error {
			if err := localize(files, tmp, map[string]*string{"policy": &o.PolicyFile, "model": &o.Engine.Model,
				"api-keys": &o.Auth.APIKeysFile, "metrics-token-file": &o.Auth.MetricsTokenFile, "kv-hash-key-file": &o.KVHashKeyFile}); err != nil {
				return err
			}
			if err := localizeTLS(files, tmp, &o.TLS); err != nil {
				return err
			}
			// The region's TLS files, apart from the cluster's of the
			// same names.
			regionTmp := filepath.Join(tmp, "region")
			if err := os.Mkdir(regionTmp, 0o700); err != nil {
				return err
			}
			if err := localizeTLS(files, regionTmp, &o.Region.TLS); err != nil {
				return err
			}
			if err := localizeGRPCAuth(files, tmp, &o.GRPCAuth); err != nil {
				return err
			}
			if err := o.Complete(); err != nil {
				return err
			}
			return errors.Join(o.Validate(), po.Validate(o))
		}
	},
	"prefill-worker": func() (*flag.FlagSet, func(mountedFiles, string) error) {
		o := workerrun.NewPrefillOptions()
		fs := flag.NewFlagSet("prefill-worker", flag.ContinueOnError)
		o.AddFlags(fs)
		return fs, func(files mountedFiles, tmp string) error {
			if err := localize(files, tmp, map[string]*string{"model": &o.Engine.Model, "kv-hash-key-file": &o.KVHashKeyFile}); err != nil {
				return err
			}
			if err := localizeTLS(files, tmp, &o.TLS); err != nil {
				return err
			}
			if err := localizeGRPCAuth(files, tmp, &o.GRPCAuth); err != nil {
				return err
			}
			return o.Validate()
		}
	},
	"decode-worker": func() (*flag.FlagSet, func(mountedFiles, string) error) {
		o := workerrun.NewDecodeOptions()
		fs := flag.NewFlagSet("decode-worker", flag.ContinueOnError)
		o.AddFlags(fs)
		return fs, func(files mountedFiles, tmp string) error {
			if err := localize(files, tmp, map[string]*string{"model": &o.Engine.Model, "kv-hash-key-file": &o.KVHashKeyFile}); err != nil {
				return err
			}
			if err := localizeTLS(files, tmp, &o.TLS); err != nil {
				return err
			}
			if err := localizeGRPCAuth(files, tmp, &o.GRPCAuth); err != nil {
				return err
			}
			return o.Validate()
		}
	},
}

// localize replaces each non-empty path (a flag's value, by flag name) by
// a scratch file in tmp with the content files mounts at that path.
// Errors: a path where nothing is mounted.
func localize(files mountedFiles, tmp string, paths map[string]*string) error {
	for name, p := range paths {
		if *p == "" {
			continue
		}
		content, ok := files[*p]
		if !ok {
			return fmt.Errorf("--%s=%s: nothing of the release is mounted there", name, *p)
		}
		local := filepath.Join(tmp, name)
		if err := os.WriteFile(local, []byte(content), 0o600); err != nil {
			return err
		}
		*p = local
	}
	return nil
}

// localizeTLS localizes the files of TLS options.
func localizeTLS(files mountedFiles, tmp string, o *grpcnet.TLSOptions) error {
	return localize(files, tmp, map[string]*string{"tls-cert": &o.CertFile, "tls-key": &o.KeyFile, "tls-ca": &o.CAFile})
}

// localizeGRPCAuth localizes the token files of gRPC authorization options.
func localizeGRPCAuth(files mountedFiles, tmp string, o *grpcauth.Options) error {
	return localize(files, tmp, map[string]*string{"grpc-token-file": &o.TokenFile, "grpc-prefill-token-file": &o.PrefillTokenFile})
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
// arguments, and none may be a deprecated flag of a policy setting
// (coordinator.PolicyFlags): the chart says those once, in the policy
// file. It returns the parsed flag values by name, and the error of the
// options' validation separately (nil when they are valid).
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
		for _, f := range coordinator.PolicyFlags {
			if f.Name == name {
				return nil, nil, fmt.Errorf("flag --%s is deprecated: the chart must set %s in the policy instead", name, f.Key)
			}
		}
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

// mounts returns the files the release mounts into container c of spec:
// every key of a ConfigMap or Secret volume the release renders, at
// mountPath/key (only the items' paths when the volume lists items).
// Secrets the user or cert-manager provides (tls.existingSecret,
// tls.roleSecrets, the Certificates' Secrets, grpc.tokenSecret) are not
// part of the release: samples of what the chart documents stand in for
// them (providedSecret), e.g. a kubernetes.io/tls Secret with tls.crt,
// tls.key and ca.crt whose certificate names tls.serverName. Likewise the model volume (a claim or
// node directory of the user's, or an emptyDir the model-download init
// container fills) holds model.file, the documented place of the GGUF
// model: an empty GGUF file stands in for it.
func (r release) mounts(t *testing.T, spec *corev1.PodSpec, c corev1.Container) mountedFiles {
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
			if data = r.providedSecret(t, v.Secret.SecretName, c.Name); data != nil {
				break
			}
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
		if v.Secret != nil && len(v.Secret.Items) > 0 {
			picked := map[string]string{}
			for _, it := range v.Secret.Items {
				if content, ok := data[it.Key]; ok {
					picked[it.Path] = content
				}
			}
			data = picked
		}
		if m.Name == modelVolume && r.value("engine.type") == "llamacpp" {
			data = map[string]string{fmt.Sprint(r.value("model.file")): emptyGGUF}
		}
		for k, content := range data {
			files[filepath.Join(m.MountPath, k)] = content
		}
	}
	return files
}

// modelVolume is the name of the chart's model volume.
const modelVolume = "model"

// emptyGGUF is a GGUF file (version 3) with no tensors and no metadata.
const emptyGGUF = "GGUF" + "\x03\x00\x00\x00" + "\x00\x00\x00\x00\x00\x00\x00\x00" + "\x00\x00\x00\x00\x00\x00\x00\x00"

// sampleTLSSecret returns the data of a kubernetes.io/tls Secret, as
// cert-manager issues it (tls.crt, tls.key, ca.crt), for a certificate
// naming serverName and allowing server and client authentication.
func sampleTLSSecret(t *testing.T, serverName string) map[string]string {
	t.Helper()
	return sampleTLSData(t, tlstest.Leaf{DNSNames: []string{serverName}})
}
