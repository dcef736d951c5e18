package charttest

import (
	"bufio"
	"os"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// docsFile is the user documentation of the chart; its "Secrets to
// create" table lists every Secret of the user's the chart's objects may
// reference.
const docsFile = "../../docs/kubernetes.md"

// secretRow is one row of the table: a Secret of the user's, the value
// that names it, the keys the release reads from it, who reads them and
// the command that creates it.
type secretRow struct {
	line    int
	name    string   // the example name, as the command creates it
	setting string   // values path; "[]" steps into a list, e.g. ingress.tls[].secretName
	keys    []string // sorted
	readers []string // sorted, words of readerWords
	command string
}

// readerWords name who reads a Secret: a component of the release (its
// pods' app.kubernetes.io/component), or Prometheus (through the
// ServiceMonitor or PodMonitor) and the Ingress controller.
var readerWords = regexp.MustCompile(`(?i)\b(coordinator|prefill|decode|nats|test|prometheus|ingress)\b`)

var codeSpan = regexp.MustCompile("`([^`]+)`")

// splitRow splits a Markdown table row on the pipes that are not escaped.
func splitRow(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimPrefix(line, "|")
	line = strings.TrimSuffix(line, "|")
	var cells []string
	var cur strings.Builder
	for i := 0; i < len(line); i++ {
		switch {
		case line[i] == '\\' && i+1 < len(line) && line[i+1] == '|':
			cur.WriteByte('|')
			i++
		case line[i] == '|':
			cells = append(cells, strings.TrimSpace(cur.String()))
			cur.Reset()
		default:
			cur.WriteByte(line[i])
		}
	}
	return append(cells, strings.TrimSpace(cur.String()))
}

// codes returns the code spans of a cell.
func codes(cell string) []string {
	var out []string
	for _, m := range codeSpan.FindAllStringSubmatch(cell, -1) {
		out = append(out, m[1])
	}
	return out
}

// secretsTable parses the first table after the heading "## Secrets to
// create" of docsFile.
func secretsTable(t *testing.T) []secretRow {
	t.Helper()
	f, err := os.Open(docsFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []secretRow
	section, inTable := false, false
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			if inTable {
				return rows
			}
			section = strings.TrimSpace(line) == "## Secrets to create"
			continue
		case !section:
			continue
		case !strings.HasPrefix(strings.TrimSpace(line), "|"):
			if inTable {
				return rows
			}
			continue
		}
		cells := splitRow(line)
		if !inTable { // the header
			want := []string{"Secret", "Set in", "Keys", "Read by", "Create it with"}
			if !slices.Equal(cells, want) {
				t.Fatalf("%s:%d: table header %q, want %q", docsFile, n, cells, want)
			}
			inTable = true
			continue
		}
		if strings.Trim(strings.Join(cells, ""), "-: ") == "" {
			continue // the delimiter row
		}
		if len(cells) != 5 {
			t.Fatalf("%s:%d: %d cells, want 5: %q", docsFile, n, len(cells), line)
		}
		r := secretRow{line: n}
		name, setting, command := codes(cells[0]), codes(cells[1]), codes(cells[4])
		if len(name) != 1 || len(setting) != 1 || len(command) != 1 {
			t.Fatalf("%s:%d: want one code span each for the Secret, its setting and its command: %q", docsFile, n, line)
		}
		r.name, r.setting, r.command = name[0], setting[0], command[0]
		r.keys = codes(cells[2])
		sort.Strings(r.keys)
		for _, w := range readerWords.FindAllString(cells[3], -1) {
			if w = strings.ToLower(w); !slices.Contains(r.readers, w) {
				r.readers = append(r.readers, w)
			}
		}
		sort.Strings(r.readers)
		if len(r.keys) == 0 || len(r.readers) == 0 {
			t.Fatalf("%s:%d: a row without keys or readers: %q", docsFile, n, line)
		}
		rows = append(rows, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		t.Fatalf("%s: no table under \"## Secrets to create\"", docsFile)
	}
	return rows
}

// valuesAt returns the strings at a values path of r, stepping into every
// element of a list at "[]" (ingress.tls[].secretName).
func valuesAt(v any, p string) []string {
	if p == "" {
		if s, ok := v.(string); ok && s != "" {
			return []string{s}
		}
		return nil
	}
	head, rest, _ := strings.Cut(p, ".")
	list := strings.HasSuffix(head, "[]")
	head = strings.TrimSuffix(head, "[]")
	m, ok := v.(map[string]any)
	if !ok {
		return nil
	}
	next := m[head]
	if !list {
		return valuesAt(next, rest)
	}
	var out []string
	items, _ := next.([]any)
	for _, it := range items {
		out = append(out, valuesAt(it, rest)...)
	}
	return out
}

// secretRef is one reference of the release to a key of a Secret.
type secretRef struct {
	secret, key string
	reader      string // readerWords
	where       string // the object and field, for messages
}

// secretRefs lists every reference of r's objects to a Secret: pod
// volumes (their items, or the files the containers' args and env name
// under the mount), env secretKeyRef, envFrom, imagePullSecrets, the
// monitors' bearer tokens and the Ingress's certificates.
func secretRefs(t *testing.T, r release) []secretRef {
	t.Helper()
	var out []secretRef
	for _, o := range r.objects {
		var spec *corev1.PodSpec
		var reader string
		switch o.kind {
		case "Pod":
			p := o.obj.(*corev1.Pod)
			spec, reader = &p.Spec, p.Labels["app.kubernetes.io/component"]
		case "Deployment":
			d := o.obj.(*appsv1.Deployment)
			spec, reader = &d.Spec.Template.Spec, d.Spec.Template.Labels["app.kubernetes.io/component"]
		case "ServiceMonitor":
			for _, e := range o.obj.(*serviceMonitor).Spec.Endpoints {
				if a := e.Authorization; a != nil {
					out = append(out, secretRef{a.Credentials.Name, a.Credentials.Key, "prometheus", o.kind + "/" + o.name})
				}
			}
		case "PodMonitor":
			for _, e := range o.obj.(*podMonitor).Spec.PodMetricsEndpoints {
				if a := e.Authorization; a != nil {
					out = append(out, secretRef{a.Credentials.Name, a.Credentials.Key, "prometheus", o.kind + "/" + o.name})
				}
			}
		case "Ingress":
			for _, tls := range o.obj.(*networkingv1.Ingress).Spec.TLS {
				for _, k := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey} {
					out = append(out, secretRef{tls.SecretName, k, "ingress", o.kind + "/" + o.name})
				}
			}
		}
		if spec != nil {
			out = append(out, podSecretRefs(t, o.kind+"/"+o.name, spec, reader)...)
		}
	}
	return out
}

// podSecretRefs lists the Secret references of one pod spec.
func podSecretRefs(t *testing.T, where string, spec *corev1.PodSpec, reader string) []secretRef {
	t.Helper()
	var out []secretRef
	for _, s := range spec.ImagePullSecrets {
		out = append(out, secretRef{s.Name, corev1.DockerConfigJsonKey, reader, where + " imagePullSecrets"})
	}
	containers := append(slices.Clone(spec.InitContainers), spec.Containers...)
	for _, v := range spec.Volumes {
		if v.Projected != nil {
			for _, src := range v.Projected.Sources {
				if src.Secret != nil {
					if len(src.Secret.Items) == 0 {
						t.Errorf("%s: projected volume %s takes all of Secret %s: list its items", where, v.Name, src.Secret.Name)
					}
					for _, it := range src.Secret.Items {
						out = append(out, secretRef{src.Secret.Name, it.Key, reader, where + " volume " + v.Name})
					}
				}
			}
		}
		if v.Secret == nil {
			continue
		}
		vw := where + " volume " + v.Name
		if len(v.Secret.Items) > 0 {
			for _, it := range v.Secret.Items {
				out = append(out, secretRef{v.Secret.SecretName, it.Key, reader, vw})
			}
			continue
		}
		// The whole Secret is mounted: the keys read are the files the
		// containers name under the mount.
		var keys []string
		for _, c := range containers {
			for _, m := range c.VolumeMounts {
				if m.Name != v.Name {
					continue
				}
				dir := strings.TrimSuffix(m.MountPath, "/") + "/"
				texts := slices.Clone(c.Args)
				texts = append(texts, c.Command...)
				for _, e := range c.Env {
					texts = append(texts, e.Value)
				}
				for _, s := range texts {
					for rest := s; ; {
						i := strings.Index(rest, dir)
						if i < 0 {
							break
						}
						rest = rest[i+len(dir):]
						key, _, _ := strings.Cut(rest, "/")
						f := strings.FieldsFunc(key, func(r rune) bool { return r == ',' || r == ' ' || r == '"' })
						if len(f) == 0 {
							continue
						}
						if key = f[0]; !slices.Contains(keys, key) {
							keys = append(keys, key)
						}
					}
				}
			}
		}
		if len(keys) == 0 {
			t.Errorf("%s: mounts all of Secret %s, but no container names a file in it", vw, v.Secret.SecretName)
		}
		for _, k := range keys {
			out = append(out, secretRef{v.Secret.SecretName, path.Clean(k), reader, vw})
		}
	}
	for _, c := range containers {
		for _, e := range c.Env {
			if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil {
				out = append(out, secretRef{ref.SecretKeyRef.Name, ref.SecretKeyRef.Key, reader, where + "/" + c.Name + " env " + e.Name})
			}
		}
		for _, e := range c.EnvFrom {
			if e.SecretRef != nil {
				t.Errorf("%s/%s: envFrom all of Secret %s: name its keys", where, c.Name, e.SecretRef.Name)
			}
		}
	}
	return out
}

// secretsRenders are the releases the table is checked against: every
// values set of helm/pdserve/ci, and production with the settings it
// leaves out, so that every row of the table is read by some release.
var secretsRenders = []struct{ name, base, over string }{
	{"production with a policy Secret, a test key and a pull secret", "production", `
apiKeys: {existingSecret: pdserve-policy}
test: {apiKeySecret: pdserve-test-key}
imagePullSecrets: [{name: regcred}]
`},
	{"production with a certificate Secret per role and a downloaded model", "production", `
tls:
  certManager: {enabled: false}
  roleSecrets: {coordinator: pdserve-coordinator-tls, prefill: pdserve-prefill-tls, decode: pdserve-decode-tls}
  identities: {coordinator: "spiffe://example.org/pdserve/coordinator", prefill: "spiffe://example.org/pdserve/prefill"}
model:
  source: download
  download:
    url: https://models.example.com/model-q8_0.gguf
    tokenSecret: {name: hf-token, key: token}
    into: pvc
metrics:
  serviceMonitor: {enabled: false}
  podMonitor: {enabled: true}
`},
	{"production as a region", "production", `
region:
  name: us-east
  advertiseURL: https://pdserve.us-east.example.com:8443
  tlsSecret: pdserve-region-tls
  gateway: {peers: [{name: eu-west, url: "nats://nats-gw.eu-west.example.com:7222"}]}
networkPolicy: {enabled: false}
`},
}

// TestSecretsTable: every Secret the release's pods (and its monitors and
// Ingress) reference, and that the release does not create itself (nor
// cert-manager from its Certificates), is a row of docs/kubernetes.md's
// "Secrets to create", found by the value that names it; the keys read
// and who reads them are the row's; and every key and reader of every row
// is read by some release, so the table holds nothing the chart does not
// use. Each row's command creates the Secret under the row's name with
// the row's keys.
func TestSecretsTable(t *testing.T) {
	rows := secretsTable(t)
	settings := map[string]bool{}
	for _, row := range rows {
		if settings[row.setting] {
			t.Errorf("%s:%d: %s listed twice", docsFile, row.line, row.setting)
		}
		settings[row.setting] = true
		checkCreateCommand(t, row)
	}
	seen := map[string]bool{} // "<setting> key <k>", "<setting> reader <r>"
	check := func(t *testing.T, r release) {
		created := map[string]bool{}
		for _, o := range r.all("Secret") {
			created[o.name] = true
		}
		for _, o := range r.all("Certificate") {
			created[o.obj.(*certificate).Spec.SecretName] = true
		}
		values := r.values.AsMap()
		for _, ref := range secretRefs(t, r) {
			if created[ref.secret] {
				continue
			}
			var match []secretRow
			for _, row := range rows {
				if slices.Contains(valuesAt(values, row.setting), ref.secret) {
					match = append(match, row)
				}
			}
			if len(match) == 0 {
				t.Errorf("%s: Secret %s (key %s) is neither the release's nor named by a setting of the table in %s", ref.where, ref.secret, ref.key, docsFile)
				continue
			}
			keyOK, readerOK := false, false
			for _, row := range match {
				if slices.Contains(row.keys, ref.key) {
					keyOK = true
					seen[row.setting+" key "+ref.key] = true
				}
				if slices.Contains(row.readers, ref.reader) {
					readerOK = true
					seen[row.setting+" reader "+ref.reader] = true
				}
			}
			if !keyOK {
				t.Errorf("%s: reads key %s of Secret %s, which the table's row for %s does not list", ref.where, ref.key, ref.secret, match[0].setting)
			}
			if !readerOK {
				t.Errorf("%s: %s reads Secret %s, which the table's row for %s does not say", ref.where, ref.reader, ref.secret, match[0].setting)
			}
		}
	}
	for _, vs := range valuesSets(t) {
		t.Run(vs.name, func(t *testing.T) {
			r := render(t, vs)
			check(t, r)
			if vs.name == "production" {
				checkProductionHeader(t, r, vs.file)
			}
		})
	}
	for _, rr := range secretsRenders {
		t.Run(rr.name, func(t *testing.T) { check(t, renderOver(t, rr.base, rr.over)) })
	}
	if t.Failed() {
		return
	}
	for _, row := range rows {
		for _, k := range row.keys {
			if !seen[row.setting+" key "+k] {
				t.Errorf("%s:%d: no release reads key %s of %s", docsFile, row.line, k, row.setting)
			}
		}
		for _, rd := range row.readers {
			if !seen[row.setting+" reader "+rd] {
				t.Errorf("%s:%d: %s reads %s in no release", docsFile, row.line, rd, row.setting)
			}
		}
	}
}

// checkCreateCommand: the row's command creates a Secret in the release's
// namespace under the row's name, with each of its keys.
func checkCreateCommand(t *testing.T, row secretRow) {
	t.Helper()
	fields := strings.Fields(row.command)
	i := slices.Index(fields, "create")
	if i < 0 || i+3 >= len(fields) || fields[0] != "kubectl" && !strings.Contains(row.command, "; kubectl ") || fields[i+1] != "secret" {
		t.Errorf("%s:%d: command %q is no kubectl create secret", docsFile, row.line, row.command)
		return
	}
	kind, name := fields[i+2], fields[i+3]
	if name != row.name {
		t.Errorf("%s:%d: command creates %s, want %s", docsFile, row.line, name, row.name)
	}
	if !strings.Contains(row.command, "-n "+namespace+" ") {
		t.Errorf("%s:%d: command %q does not create the Secret in namespace %s", docsFile, row.line, row.command, namespace)
	}
	made := map[string][]string{"tls": {corev1.TLSCertKey, corev1.TLSPrivateKeyKey}, "docker-registry": {corev1.DockerConfigJsonKey}}
	for _, k := range row.keys {
		if slices.Contains(made[kind], k) {
			continue
		}
		if !strings.Contains(row.command, "--from-literal="+k+"=") && !strings.Contains(row.command, "--from-file="+k+"=") {
			t.Errorf("%s:%d: command %q does not set key %s", docsFile, row.line, row.command, k)
		}
	}
}

// checkProductionHeader: the comment atop ci/production-values.yaml names
// every Secret of the user's that the release reads.
func checkProductionHeader(t *testing.T, r release, file string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var header strings.Builder
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "#") {
			break
		}
		header.WriteString(line + "\n")
	}
	created := map[string]bool{}
	for _, o := range r.all("Secret") {
		created[o.name] = true
	}
	for _, o := range r.all("Certificate") {
		created[o.obj.(*certificate).Spec.SecretName] = true
	}
	for _, ref := range secretRefs(t, r) {
		if !created[ref.secret] && !regexp.MustCompile(`\b`+regexp.QuoteMeta(ref.secret)+`\b`).MatchString(header.String()) {
			t.Errorf("%s: its header does not name Secret %s (%s)", file, ref.secret, ref.where)
		}
	}
}
