package charttest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	corev1 "k8s.io/api/core/v1"

	"github.com/pdserve/pdserve/pkg/control"
)

// natsUserOf maps a pdserve container to the bundled NATS server's user it
// logs in as.
var natsUserOf = map[string]string{"coordinator": "coordinator", "prefill-worker": "prefill", "decode-worker": "decode"}

// TestNATSAuth: with the bundled NATS server, its config (as nats-server
// parses it, passwords from the auth Secret as the NATS pod's environment
// passes them) has one user per role with exactly pkg/control's
// permissions for that role, and every pdserve container logs in as its
// role's user with the password file mounted from that Secret's key.
// With an external server no container gets NATS credential flags.
func TestNATSAuth(t *testing.T) {
	for _, vs := range valuesSets(t) {
		t.Run(vs.name, func(t *testing.T) {
			r := render(t, vs)
			bundled, _ := r.value("nats.bundled").(bool)
			if !bundled {
				for _, p := range pools(r) {
					c := container(t, &r.deployment(t, p.deployment).Spec.Template.Spec, p.container)
					if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--nats-user") }) {
						t.Errorf("%s: NATS credential flags with an external server: %q", p.deployment, c.Args)
					}
				}
				return
			}
			secretName := releaseName + "-pdserve-nats-auth"
			// A Secret of the user's: passwords of any characters but '"'
			// and '\\', digits only included (which nats-server would read
			// as a number unless quoted).
			passwords := map[string]string{"coordinator": "0123456789", "prefill": "p@ss w0rd$HOME", "decode": "1e6", "elastic": "true"}
			elastic, _ := r.value("elastic.enabled").(bool)
			users := []string{"coordinator", "prefill", "decode"}
			if elastic {
				users = append(users, "elastic")
			}
			if s, _ := r.value("nats.auth.existingSecret").(string); s != "" {
				secretName = s
				if r.find("Secret", s) != nil {
					t.Errorf("the release renders nats.auth.existingSecret %s", s)
				}
			} else {
				secret, ok := r.find("Secret", secretName).(*corev1.Secret)
				if !ok {
					t.Fatalf("no Secret %s", secretName)
				}
				if got := keys(secret.Data); !cmp.Equal(got, slices.Sorted(slices.Values(mapKeys(users, ".password")))) {
					t.Errorf("Secret %s: keys %v, want a password per user %v", secretName, got, users)
				}
				for _, u := range users {
					pw := string(secret.Data[u+".password"])
					if len(pw) < 32 {
						t.Errorf("Secret %s: %s.password %q, want 32 random characters", secretName, u, pw)
					}
					passwords[u] = pw
				}
			}
			checkNATSServerConfig(t, r, passwords)
			for _, p := range pools(r) {
				spec := &r.deployment(t, p.deployment).Spec.Template.Spec
				checkNATSLogin(t, p.deployment, spec, container(t, spec, p.container), natsUserOf[p.container], secretName)
			}
			if elastic {
				// The elastic pool runs its starting role's binary but
				// logs in as the elastic user.
				spec := &r.deployment(t, elasticName).Spec.Template.Spec
				checkNATSLogin(t, elasticName, spec, container(t, spec, elasticBinary(r)), "elastic", secretName)
			}
		})
	}
}

// checkNATSServerConfig parses the bundled server's config with
// nats-server, its environment as the NATS container sets it, and
// compares its users with pkg/control's.
func checkNATSServerConfig(t *testing.T, r release, passwords map[string]string) {
	t.Helper()
	cm, ok := r.find("ConfigMap", natsName).(*corev1.ConfigMap)
	if !ok {
		t.Fatalf("no ConfigMap %s", natsName)
	}
	nats := container(t, &r.deployment(t, natsName).Spec.Template.Spec, "nats")
	raw := map[string]string{}
	for _, e := range nats.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			raw[e.Name] = passwords[strings.TrimSuffix(e.ValueFrom.SecretKeyRef.Key, ".password")]
		}
	}
	for _, e := range nats.Env {
		if e.ValueFrom == nil && strings.HasPrefix(e.Name, "PDSERVE_NATS_") {
			// $(VAR) as the kubelet expands it.
			t.Setenv(e.Name, envRef.ReplaceAllStringFunc(e.Value, func(ref string) string { return raw[envRef.FindStringSubmatch(ref)[1]] }))
		}
	}
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, []byte(cm.Data["nats.conf"]), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats-server rejects the config: %v\n%s", err, cm.Data["nats.conf"])
	}
	checkNATSListen(t, nats, opts.Host, opts.Port, opts.HTTPHost, opts.HTTPPort)
	roles := map[string]control.Role{
		"coordinator": control.RoleCoordinator, "prefill": control.RolePrefill,
		"decode": control.Role(r.value("decodeWorker.role").(string)),
	}
	if on, _ := r.value("elastic.enabled").(bool); on {
		roles["elastic"] = control.RoleElastic
	}
	got := map[string]*server.User{}
	for _, u := range opts.Users {
		got[u.Username] = u
	}
	if len(got) != len(roles) {
		t.Errorf("users %v, want %v", keys(got), keys(roles))
	}
	for name, role := range roles {
		u, ok := got[name]
		if !ok {
			t.Errorf("no NATS user %s", name)
			continue
		}
		if u.Password != passwords[name] {
			t.Errorf("user %s: password %q from the environment, want the Secret's %q", name, u.Password, passwords[name])
		}
		want, err := control.Permissions(role, "")
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, u.Permissions); diff != "" {
			t.Errorf("user %s: permissions (-pkg/control +chart):\n%s", name, diff)
		}
	}
}

// checkNATSLogin: c logs in as user with the password file from the key
// <user>.password of Secret secret, and mounts no other key of it.
func checkNATSLogin(t *testing.T, where string, spec *corev1.PodSpec, c corev1.Container, user, secret string) {
	t.Helper()
	args := map[string]string{}
	for _, a := range c.Args {
		name, value, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		args[name] = value
	}
	if args["nats-user"] != user {
		t.Errorf("%s: --nats-user=%q, want %s", where, args["nats-user"], user)
	}
	file := args["nats-password-file"]
	for _, m := range c.VolumeMounts {
		if !strings.HasPrefix(file, m.MountPath+"/") {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name != m.Name || v.Secret == nil {
				continue
			}
			if v.Secret.SecretName != secret {
				t.Errorf("%s: password from Secret %s, want %s", where, v.Secret.SecretName, secret)
			}
			want := []corev1.KeyToPath{{Key: user + ".password", Path: strings.TrimPrefix(file, m.MountPath+"/")}}
			if diff := cmp.Diff(want, v.Secret.Items); diff != "" {
				t.Errorf("%s: keys of Secret %s mounted (-want +got):\n%s", where, secret, diff)
			}
			return
		}
	}
	t.Errorf("%s: --nats-password-file=%q is on no Secret volume", where, file)
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// mapKeys returns each of names with suffix appended.
func mapKeys(names []string, suffix string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = n + suffix
	}
	return out
}
