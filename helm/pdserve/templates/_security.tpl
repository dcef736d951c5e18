{{/*
Who may call whom: the gRPC tokens, the per-role TLS certificates and the
identities workers allow. The NetworkPolicies are in networkpolicy.yaml,
the Certificates in certificates.yaml, the token Secret in
grpc-token-secret.yaml.
*/}}

{{/*
Secret holding the gRPC tokens: grpc.tokenSecret, or the chart's own.
Keys (all four; the chart generates them, a Secret of yours needs them):
  coordinator.token   the coordinator's token: the coordinator sends it
  coordinator.sha256  "sha256:<hex>" of it: workers check it
  prefill.token       the prefill workers' token: they send it on KV pushes
  prefill.sha256      "sha256:<hex>" of it: decode workers check it
So no worker holds a token that would let it act as the coordinator. The
elastic pool holds the prefill workers' keys: it sends KV as they do.
Beside an elastic pool the decode pool holds prefill.token too, which it
sends on its pulls (a sequence migrated off an elastic worker leaving
decode); with TLS its certificate is allowed KV only on elastic workers
(--tls-allow-prefill), so it still cannot push to a decode worker.
Without an elastic pool a decode worker holds no token at all.
*/}}
{{- define "pdserve.grpcTokenSecret" -}}
{{- default (printf "%s-grpc-token" (include "pdserve.fullname" .)) .Values.grpc.tokenSecret }}
{{- end }}

{{/*
Where the token files are mounted in every pdserve container.
*/}}
{{- define "pdserve.grpcTokenDir" -}}
/etc/pdserve/grpc
{{- end }}

{{/*
Keys of the token Secret a role mounts (see pdserve.grpcTokenSecret), as a
YAML list. Call with (dict "root" $ "role" "coordinator|prefill|decode|elastic").
*/}}
{{- define "pdserve.grpcTokenKeys" -}}
{{- if eq .role "coordinator" }}
{{- toYaml (list "coordinator.token") }}
{{- else if include "pdserve.sendsPrefillToken" . }}
{{- toYaml (list "coordinator.sha256" "prefill.token") }}
{{- else }}
{{- toYaml (list "coordinator.sha256" "prefill.sha256") }}
{{- end }}
{{- end }}

{{/*
"true" when a worker role holds the prefill token itself, not only its
digest: the prefill and elastic pools (they push KV), and the decode pool
beside an elastic one (it pulls sequences migrated off elastic workers).
Call with (dict "root" $ "role" …).
*/}}
{{- define "pdserve.sendsPrefillToken" -}}
{{- $elastic := and .root.Values.elastic.enabled (eq .root.Values.coordinator.mode "disaggregated") }}
{{- if or (has .role (list "prefill" "elastic")) (and $elastic (eq .role "decode")) }}true{{ end }}
{{- end }}

{{/*
The gRPC authentication flags of a role as a YAML list (read back with
fromYamlArray): the token files (grpc.tokens.enabled) and, with TLS, the
certificate identities a worker allows per role (tls.identities, or the
ones the chart's cert-manager Certificates carry). Call with (dict "root"
$ "role" "coordinator|prefill|decode|elastic").
*/}}
{{- define "pdserve.grpcAuthArgs" -}}
{{- $root := .root }}
{{- $dir := include "pdserve.grpcTokenDir" $root }}
{{- $elastic := and $root.Values.elastic.enabled (eq $root.Values.coordinator.mode "disaggregated") }}
{{- $args := list }}
{{- if $root.Values.grpc.tokens.enabled }}
{{- if eq .role "coordinator" }}
{{- $args = append $args (printf "--grpc-token-file=%s/coordinator.token" $dir) }}
{{- else }}
{{- $args = append $args (printf "--grpc-token-file=%s/coordinator.sha256" $dir) }}
{{- $args = append $args (printf "--grpc-prefill-token-file=%s/%s" $dir (ternary "prefill.token" "prefill.sha256" (eq (include "pdserve.sendsPrefillToken" .) "true"))) }}
{{- end }}
{{- end }}
{{- /* Who may call a worker's KV transfer (push, pull, pull of a migrated
sequence): the prefill workers; with the elastic pool, its workers too
(in either role they push or pull), and on an elastic worker the decode
workers (a migration off it when it leaves decode). Never the
coordinator's methods: only tls.identities.coordinator may. */}}
{{- if and $root.Values.tls.enabled (ne .role "coordinator") }}
{{- with include "pdserve.tlsIdentity" (dict "root" $root "role" "coordinator") }}
{{- $args = append $args (printf "--tls-allow-coordinator=%s" .) }}
{{- end }}
{{- $kvRoles := list "prefill" }}
{{- if $elastic }}
{{- $kvRoles = append $kvRoles "elastic" }}
{{- end }}
{{- if eq .role "elastic" }}
{{- $kvRoles = append $kvRoles "decode" }}
{{- end }}
{{- $kv := list }}
{{- range $kvRoles }}
{{- with include "pdserve.tlsIdentity" (dict "root" $root "role" .) }}
{{- $kv = append $kv . }}
{{- end }}
{{- end }}
{{- with $kv }}
{{- $args = append $args (printf "--tls-allow-prefill=%s" (join "," .)) }}
{{- end }}
{{- end }}
{{- /* The identities the coordinator (of every worker) and the prefill
workers (of their decode peers) require of a server's certificate before
any call to it: the decode pool's certificate for role decode (colocated
in colocated mode), the prefill pool's for role prefill. With the
elastic pool, its certificate for either role too, and every worker
checks its peers so (a push, a pull, a migration's pull; an elastic
worker is a client in both roles). Without identities (one shared
certificate) any certificate of the CA. */}}
{{- if and $root.Values.tls.enabled (or $elastic (eq .role "coordinator") (eq .role "prefill")) }}
{{- $decodeRole := ternary "decode" "colocated" (eq $root.Values.coordinator.mode "disaggregated") }}
{{- $ids := list }}
{{- $servers := list "decode" }}
{{- if $elastic }}
{{- $servers = list "decode" "elastic" }}
{{- end }}
{{- range $servers }}
{{- with include "pdserve.tlsIdentity" (dict "root" $root "role" .) }}
{{- $ids = append $ids (printf "%s=%s" $decodeRole .) }}
{{- end }}
{{- end }}
{{- if or $elastic (and (eq .role "coordinator") (eq $root.Values.coordinator.mode "disaggregated")) }}
{{- $servers = list "prefill" }}
{{- if $elastic }}
{{- $servers = list "prefill" "elastic" }}
{{- end }}
{{- range $servers }}
{{- with include "pdserve.tlsIdentity" (dict "root" $root "role" .) }}
{{- $ids = append $ids (printf "prefill=%s" .) }}
{{- end }}
{{- end }}
{{- end }}
{{- $args = append $args (printf "--tls-worker-identity=%s" (join "," $ids)) }}
{{- end }}
{{- toYaml $args }}
{{- end }}

{{/*
Volume mount of the token files; empty without grpc.tokens.enabled.
*/}}
{{- define "pdserve.grpcTokenMount" -}}
{{- if .Values.grpc.tokens.enabled }}
- name: grpc-token
  mountPath: {{ include "pdserve.grpcTokenDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/*
The token volume of a role: only the keys that role needs. Call with
(dict "root" $ "role" "coordinator|prefill|decode"); empty without
grpc.tokens.enabled.
*/}}
{{- define "pdserve.grpcTokenVolume" -}}
{{- if .root.Values.grpc.tokens.enabled }}
- name: grpc-token
  secret:
    secretName: {{ include "pdserve.grpcTokenSecret" .root }}
    items:
      {{- range include "pdserve.grpcTokenKeys" . | fromYamlArray }}
      - key: {{ . }}
        path: {{ . }}
      {{- end }}
{{- end }}
{{- end }}

{{/*
Where the certificates come from with tls.enabled: "certManager"
(tls.certManager.enabled: the chart's Certificates), "secrets" (the
user's tls.existingSecret or tls.roleSecrets) or "generated" (neither:
the chart generates a CA and a certificate per role, tls-secrets.yaml).
*/}}
{{- define "pdserve.tlsSource" -}}
{{- $t := .Values.tls }}
{{- if $t.certManager.enabled }}certManager
{{- else if or $t.existingSecret $t.roleSecrets.coordinator $t.roleSecrets.prefill $t.roleSecrets.decode $t.roleSecrets.elastic }}secrets
{{- else }}generated
{{- end }}
{{- end }}

{{/*
The roles of the release that mount a certificate, as a YAML list:
coordinator and decode, and prefill in disaggregated mode, and elastic
with the elastic pool.
*/}}
{{- define "pdserve.tlsRoles" -}}
{{- $roles := list "coordinator" "decode" }}
{{- if eq .Values.coordinator.mode "disaggregated" }}
{{- $roles = append $roles "prefill" }}
{{- if .Values.elastic.enabled }}
{{- $roles = append $roles "elastic" }}
{{- end }}
{{- end }}
{{- toYaml $roles }}
{{- end }}

{{/*
The TLS Secret a role mounts: with tls.certManager.enabled the one its
Certificate fills, with generated certificates the chart's own (both
"<fullname>-<role>-tls"), else tls.roleSecrets.<role>, else the shared
tls.existingSecret. Call with (dict "root" $ "role" ...).
*/}}
{{- define "pdserve.tlsSecret" -}}
{{- $t := .root.Values.tls }}
{{- if has (include "pdserve.tlsSource" .root) (list "certManager" "generated") }}
{{- printf "%s-%s-tls" (include "pdserve.fullname" .root) .role }}
{{- else }}
{{- required (printf "tls.existingSecret or tls.roleSecrets.%s is required when tls.enabled with Secrets of yours" .role) (default $t.existingSecret (index $t.roleSecrets .role)) }}
{{- end }}
{{- end }}

{{/*
The generated certificates (tls.enabled with no Secret of the user's and
no cert-manager) as JSON: {"<role>": {"tls.crt", "tls.key", "ca.crt"},
"notAfter": RFC 3339, "spec": digest}. One ECDSA P-256 CA signs one
certificate per role (pdserve.tlsRoles), valid tls.generated.validityDays;
its key is discarded, so nothing can sign another. Each certificate's
DNS names are its role's identity (pdserve.tlsIdentity) and, for the
workers, tls.serverName; its common name is the identity. On upgrade,
lookup reads the Secrets back and keeps them byte for byte while they
carry this release's spec (the names and lifetime they were made for)
and expire more than tls.generated.renewDays from now; otherwise all are
made anew, with a new CA, and the pods roll (pdserve.tlsPodAnnotation).
Computed once per render: every template that asks gets the same.
*/}}
{{- define "pdserve.tlsGenerated" -}}
{{- if not (hasKey . "pdserveTLSGenerated") }}
{{- $t := .Values.tls }}
{{- $roles := include "pdserve.tlsRoles" . | fromYamlArray }}
{{- $names := dict }}
{{- range $role := $roles }}
{{- $dns := list (include "pdserve.tlsIdentity" (dict "root" $ "role" $role)) }}
{{- if ne $role "coordinator" }}
{{- $dns = prepend $dns $t.serverName }}
{{- end }}
{{- $_ := set $names $role $dns }}
{{- end }}
{{- $spec := printf "%s/%d" (toJson $names) (int64 $t.generated.validityDays) | sha256sum }}
{{- $renewBy := now | dateModify (printf "%dh" (mul 24 (int64 $t.generated.renewDays))) | unixEpoch | int64 }}
{{- $out := dict "spec" $spec }}
{{- $keep := true }}
{{- $notAfter := "" }}
{{- range $role := $roles }}
{{- $s := lookup "v1" "Secret" $.Release.Namespace (include "pdserve.tlsSecret" (dict "root" $ "role" $role)) }}
{{- $ann := dig "metadata" "annotations" dict $s }}
{{- $na := index $ann "pdserve.io/tls-not-after" | default "" }}
{{- if or (ne (index $ann "pdserve.io/tls-spec" | default "") $spec) (not $na) }}
{{- $keep = false }}
{{- else if lt (toDate "2006-01-02T15:04:05Z07:00" $na | unixEpoch | int64) $renewBy }}
{{- $keep = false }}
{{- else }}
{{- $data := dig "data" dict $s }}
{{- $files := dict }}
{{- range $key := list "tls.crt" "tls.key" "ca.crt" }}
{{- if not (hasKey $data $key) }}
{{- $keep = false }}
{{- else }}
{{- $_ := set $files $key (index $data $key | b64dec) }}
{{- end }}
{{- end }}
{{- $_ := set $out $role $files }}
{{- $notAfter = $na }}
{{- end }}
{{- end }}
{{- if not $keep }}
{{- $days := int $t.generated.validityDays }}
{{- $ca := genCAWithKey (printf "%s pdserve gRPC CA" (include "pdserve.fullname" .)) $days (genPrivateKey "ecdsa") }}
{{- $out = dict "spec" $spec }}
{{- range $role := $roles }}
{{- $dns := index $names $role }}
{{- $cert := genSignedCertWithKey (last $dns) nil $dns $days $ca (genPrivateKey "ecdsa") }}
{{- $_ := set $out $role (dict "tls.crt" $cert.Cert "tls.key" $cert.Key "ca.crt" $ca.Cert) }}
{{- end }}
{{- $notAfter = now | dateModify (printf "%dh" (mul 24 $days)) | date "2006-01-02T15:04:05Z07:00" }}
{{- end }}
{{- $_ := set $out "notAfter" $notAfter }}
{{- $_ := set . "pdserveTLSGenerated" (toJson $out) }}
{{- end }}
{{- .pdserveTLSGenerated }}
{{- end }}

{{/*
Pod annotation that rolls the pods when the CA they trust changes: the
digest of the generated CA, nothing otherwise (cert-manager's and the
user's Secrets are outside the release).
*/}}
{{- define "pdserve.tlsPodAnnotation" -}}
{{- if and .Values.tls.enabled (eq (include "pdserve.tlsSource" .) "generated") }}
{{- $gen := include "pdserve.tlsGenerated" . | fromJson }}
checksum/tls-ca: {{ index $gen "coordinator" "ca.crt" | sha256sum }}
{{- end }}
{{- end }}

{{/*
The certificate identity of a role, a URI or a DNS name among its
certificate's subject alternative names: tls.identities.<role>, else with
tls.certManager.enabled
spiffe://<tls.certManager.trustDomain>/ns/<namespace>/app/<fullname>/<role>,
else with generated certificates
<role>.<fullname>.<namespace>.pdserve.internal (a DNS name: Helm cannot
write URI names), else "" (the user's shared certificate: no identity per
role). Call with (dict "root" $ "role" ...).
*/}}
{{- define "pdserve.tlsIdentity" -}}
{{- $t := .root.Values.tls }}
{{- $id := index $t.identities .role }}
{{- $source := include "pdserve.tlsSource" .root }}
{{- if and (not $id) (eq $source "certManager") }}
{{- $id = printf "spiffe://%s/ns/%s/app/%s/%s" $t.certManager.trustDomain .root.Release.Namespace (include "pdserve.fullname" .root) .role }}
{{- else if and (not $id) (eq $source "generated") }}
{{- $id = printf "%s.%s.%s.pdserve.internal" .role (include "pdserve.fullname" .root) .root.Release.Namespace }}
{{- end }}
{{- $id }}
{{- end }}

{{/*
Fails on TLS settings that would not separate the roles: identities
without a certificate per role, identities that are equal or name
tls.serverName (which every worker's certificate carries), cert-manager
without TLS or an issuer; for generated certificates, identities that
are not DNS names and a renewal window longer than the lifetime.
Renders nothing.
*/}}
{{- define "pdserve.tlsCheck" -}}
{{- $t := .Values.tls }}
{{- $named := and (index $t.identities "coordinator") (index $t.identities "prefill") }}
{{- $anyNamed := or (index $t.identities "coordinator") (index $t.identities "prefill") (index $t.identities "decode") (index $t.identities "elastic") }}
{{- $roles := include "pdserve.tlsRoles" . | fromYamlArray }}
{{- if and (not $t.enabled) (or $t.certManager.enabled $anyNamed) }}
{{- fail "tls.certManager and tls.identities need tls.enabled=true" }}
{{- end }}
{{- if $t.enabled }}
{{- if and $t.certManager.enabled (not $t.certManager.issuerRef.name) }}
{{- fail "tls.certManager.enabled needs tls.certManager.issuerRef.name (an Issuer or ClusterIssuer that puts ca.crt into the Secret, e.g. a CA issuer)" }}
{{- end }}
{{- $source := include "pdserve.tlsSource" . }}
{{- if eq $source "generated" }}
{{- $g := $t.generated }}
{{- if ge (int64 $g.renewDays) (int64 $g.validityDays) }}
{{- fail "tls.generated.renewDays must be less than tls.generated.validityDays" }}
{{- end }}
{{- range $role := list "coordinator" "prefill" "decode" "elastic" }}
{{- $id := index $t.identities $role }}
{{- if and $id (not (regexMatch `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$` $id)) }}
{{- fail (printf "tls.identities.%s=%s: the chart's generated certificates carry DNS names only (Helm cannot write URI names); give a lower-case DNS name, or use tls.certManager or tls.roleSecrets for a URI" $role $id) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and $anyNamed (eq $source "secrets") }}
{{- if not $named }}
{{- fail "tls.identities: give both coordinator and prefill (a role left out would accept any certificate the CA signed)" }}
{{- end }}
{{- if and (has "elastic" $roles) (not (index $t.identities "elastic")) }}
{{- fail "tls.identities.elastic is required with elastic.enabled and tls.identities: the elastic pool's certificate must name an identity of its own, which the workers allow to move KV" }}
{{- end }}
{{- range $role := $roles }}
{{- if not (index $t.roleSecrets $role) }}
{{- fail (printf "tls.identities need a certificate per role: set tls.roleSecrets.%s (or tls.certManager.enabled); with one shared certificate every component would carry every identity" $role) }}
{{- end }}
{{- end }}
{{- end }}
{{- $coord := include "pdserve.tlsIdentity" (dict "root" . "role" "coordinator") }}
{{- $prefill := include "pdserve.tlsIdentity" (dict "root" . "role" "prefill") }}
{{- $decode := include "pdserve.tlsIdentity" (dict "root" . "role" "decode") }}
{{- $elastic := "" }}
{{- if has "elastic" $roles }}
{{- $elastic = include "pdserve.tlsIdentity" (dict "root" . "role" "elastic") }}
{{- end }}
{{- if $coord }}
{{- if or (eq $coord $prefill) (eq $coord $decode) (and $decode (eq $prefill $decode)) }}
{{- fail "tls.identities: coordinator, prefill and decode must differ" }}
{{- end }}
{{- if and $elastic (has $elastic (list $coord $prefill $decode)) }}
{{- fail "tls.identities.elastic must differ from coordinator, prefill and decode" }}
{{- end }}
{{- if has $t.serverName (list $coord $prefill $decode $elastic) }}
{{- fail "tls.identities must differ from tls.serverName, which every worker's certificate names" }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Egress rules every pdserve pod of the release needs, as a YAML list:
DNS, NATS (the bundled server's pods, or networkPolicy.externalNATS),
the model download (model.source download) and networkPolicy.extraEgress.
*/}}
{{- define "pdserve.netpolEgress" -}}
{{- $np := .Values.networkPolicy }}
{{- $rules := list }}
{{- $dns := dict "ports" (list (dict "port" 53 "protocol" "UDP") (dict "port" 53 "protocol" "TCP")) }}
{{- with $np.dns.to }}
{{- $_ := set $dns "to" . }}
{{- end }}
{{- $rules = append $rules $dns }}
{{- if .Values.nats.bundled }}
{{- $rules = append $rules (dict
  "to" (list (dict "podSelector" (dict "matchLabels" (include "pdserve.selectorLabels" (dict "root" . "component" "nats") | fromYaml))))
  "ports" (list (dict "port" 4222 "protocol" "TCP"))) }}
{{- else }}
{{- $rules = append $rules (include "pdserve.netpolEgressRule" $np.externalNATS | fromYaml) }}
{{- end }}
{{- if and (include "pdserve.llamacpp" .) (eq .Values.model.source "download") }}
{{- $rules = append $rules (include "pdserve.netpolEgressRule" $np.modelDownload | fromYaml) }}
{{- end }}
{{- if .Values.tracing.endpoint }}
{{- $rules = append $rules (include "pdserve.netpolEgressRule" $np.tracing | fromYaml) }}
{{- end }}
{{- toYaml (concat $rules $np.extraEgress) }}
{{- end }}

{{/*
An egress rule from (dict "to" <peers> "ports" <TCP port numbers>): to
those peers (none: any destination) on those ports.
*/}}
{{- define "pdserve.netpolEgressRule" -}}
{{- $ports := list }}
{{- range .ports }}
{{- $ports = append $ports (dict "port" (int64 .) "protocol" "TCP") }}
{{- end }}
{{- $rule := dict "ports" $ports }}
{{- with .to }}
{{- $_ := set $rule "to" . }}
{{- end }}
{{- toYaml $rule }}
{{- end }}

{{/*
The KV block-hash key: its Secret (generated by kv-hash-key-secret.yaml
unless grpc.kvHashKeySecret names one), its flag, mount and volume; all
empty with neither grpc.kvHashKey.enabled nor grpc.kvHashKeySecret.
*/}}
{{- define "pdserve.kvHashKeyOn" -}}
{{- if or .Values.grpc.kvHashKey.enabled .Values.grpc.kvHashKeySecret }}true{{ end }}
{{- end }}

{{- define "pdserve.kvHashKeySecret" -}}
{{- default (printf "%s-kv-hash-key" (include "pdserve.fullname" .)) .Values.grpc.kvHashKeySecret }}
{{- end }}

{{- define "pdserve.kvHashKeyArgs" -}}
{{- if include "pdserve.kvHashKeyOn" . }}
- --kv-hash-key-file=/etc/pdserve/kv-hash-key/key
{{- end }}
{{- end }}

{{- define "pdserve.kvHashKeyMount" -}}
{{- if include "pdserve.kvHashKeyOn" . }}
- name: kv-hash-key
  mountPath: /etc/pdserve/kv-hash-key
  readOnly: true
{{- end }}
{{- end }}

{{- define "pdserve.kvHashKeyVolume" -}}
{{- if include "pdserve.kvHashKeyOn" . }}
- name: kv-hash-key
  secret:
    secretName: {{ include "pdserve.kvHashKeySecret" . }}
    items:
      - key: key
        path: key
{{- end }}
{{- end }}
