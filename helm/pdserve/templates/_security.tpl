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
So no worker holds a token that would let it act as the coordinator, and
a decode worker holds no token at all.
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
YAML list. Call with the role: coordinator, prefill or decode.
*/}}
{{- define "pdserve.grpcTokenKeys" -}}
{{- if eq . "coordinator" }}
{{- toYaml (list "coordinator.token") }}
{{- else if eq . "prefill" }}
{{- toYaml (list "coordinator.sha256" "prefill.token") }}
{{- else }}
{{- toYaml (list "coordinator.sha256" "prefill.sha256") }}
{{- end }}
{{- end }}

{{/*
The gRPC authentication flags of a role as a YAML list (read back with
fromYamlArray): the token files (grpc.tokens.enabled) and, with TLS, the
certificate identities a worker allows per role (tls.identities, or the
ones the chart's cert-manager Certificates carry). Call with (dict "root"
$ "role" "coordinator|prefill|decode").
*/}}
{{- define "pdserve.grpcAuthArgs" -}}
{{- $root := .root }}
{{- $dir := include "pdserve.grpcTokenDir" $root }}
{{- $args := list }}
{{- if $root.Values.grpc.tokens.enabled }}
{{- if eq .role "coordinator" }}
{{- $args = append $args (printf "--grpc-token-file=%s/coordinator.token" $dir) }}
{{- else }}
{{- $args = append $args (printf "--grpc-token-file=%s/coordinator.sha256" $dir) }}
{{- $args = append $args (printf "--grpc-prefill-token-file=%s/%s" $dir (ternary "prefill.token" "prefill.sha256" (eq .role "prefill"))) }}
{{- end }}
{{- end }}
{{- if and $root.Values.tls.enabled (ne .role "coordinator") }}
{{- with include "pdserve.tlsIdentity" (dict "root" $root "role" "coordinator") }}
{{- $args = append $args (printf "--tls-allow-coordinator=%s" .) }}
{{- end }}
{{- with include "pdserve.tlsIdentity" (dict "root" $root "role" "prefill") }}
{{- $args = append $args (printf "--tls-allow-prefill=%s" .) }}
{{- end }}
{{- end }}
{{- /* The identities the coordinator (of every worker) and the prefill
workers (of their decode peers) require of a server's certificate before
any call to it: the decode pool's certificate for role decode (colocated
in colocated mode), the prefill pool's for role prefill. Without
identities (one shared certificate) any certificate of the CA. */}}
{{- if and $root.Values.tls.enabled (or (eq .role "coordinator") (eq .role "prefill")) }}
{{- $decodeRole := ternary "decode" "colocated" (eq $root.Values.coordinator.mode "disaggregated") }}
{{- $ids := list }}
{{- with include "pdserve.tlsIdentity" (dict "root" $root "role" "decode") }}
{{- $ids = append $ids (printf "%s=%s" $decodeRole .) }}
{{- end }}
{{- if eq .role "coordinator" }}
{{- with include "pdserve.tlsIdentity" (dict "root" $root "role" "prefill") }}
{{- $ids = append $ids (printf "prefill=%s" .) }}
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
      {{- range include "pdserve.grpcTokenKeys" .role | fromYamlArray }}
      - key: {{ . }}
        path: {{ . }}
      {{- end }}
{{- end }}
{{- end }}

{{/*
The TLS Secret a role mounts: with tls.certManager.enabled the one its
Certificate fills ("<fullname>-<role>-tls"), else tls.roleSecrets.<role>,
else the shared tls.existingSecret. Call with (dict "root" $ "role" ...).
*/}}
{{- define "pdserve.tlsSecret" -}}
{{- $t := .root.Values.tls }}
{{- if $t.certManager.enabled }}
{{- printf "%s-%s-tls" (include "pdserve.fullname" .root) .role }}
{{- else }}
{{- required (printf "tls.existingSecret or tls.roleSecrets.%s is required when tls.enabled" .role) (default $t.existingSecret (index $t.roleSecrets .role)) }}
{{- end }}
{{- end }}

{{/*
The certificate identity of a role, a URI or a DNS name among its
certificate's subject alternative names: tls.identities.<role>, else with
tls.certManager.enabled
spiffe://<tls.certManager.trustDomain>/ns/<namespace>/app/<fullname>/<role>,
else "" (one certificate shared by all: no identity per role). Call with
(dict "root" $ "role" ...).
*/}}
{{- define "pdserve.tlsIdentity" -}}
{{- $t := .root.Values.tls }}
{{- $id := index $t.identities .role }}
{{- if and (not $id) $t.certManager.enabled }}
{{- $id = printf "spiffe://%s/ns/%s/app/%s/%s" $t.certManager.trustDomain .root.Release.Namespace (include "pdserve.fullname" .root) .role }}
{{- end }}
{{- $id }}
{{- end }}

{{/*
Fails on TLS settings that would not separate the roles: identities
without a certificate per role, identities that are equal or name
tls.serverName (which every worker's certificate carries), cert-manager
without TLS or an issuer. Renders nothing.
*/}}
{{- define "pdserve.tlsCheck" -}}
{{- $t := .Values.tls }}
{{- $named := and (index $t.identities "coordinator") (index $t.identities "prefill") }}
{{- $anyNamed := or (index $t.identities "coordinator") (index $t.identities "prefill") (index $t.identities "decode") }}
{{- if and (not $t.enabled) (or $t.certManager.enabled $anyNamed) }}
{{- fail "tls.certManager and tls.identities need tls.enabled=true" }}
{{- end }}
{{- if $t.enabled }}
{{- if and $t.certManager.enabled (not $t.certManager.issuerRef.name) }}
{{- fail "tls.certManager.enabled needs tls.certManager.issuerRef.name (an Issuer or ClusterIssuer that puts ca.crt into the Secret, e.g. a CA issuer)" }}
{{- end }}
{{- if and $anyNamed (not $t.certManager.enabled) }}
{{- if not $named }}
{{- fail "tls.identities: give both coordinator and prefill (a role left out would accept any certificate the CA signed)" }}
{{- end }}
{{- range $role := list "coordinator" "prefill" "decode" }}
{{- if not (index $t.roleSecrets $role) }}
{{- fail (printf "tls.identities need a certificate per role: set tls.roleSecrets.%s (or tls.certManager.enabled); with one shared certificate every component would carry every identity" $role) }}
{{- end }}
{{- end }}
{{- end }}
{{- $coord := include "pdserve.tlsIdentity" (dict "root" . "role" "coordinator") }}
{{- $prefill := include "pdserve.tlsIdentity" (dict "root" . "role" "prefill") }}
{{- $decode := include "pdserve.tlsIdentity" (dict "root" . "role" "decode") }}
{{- if $coord }}
{{- if or (eq $coord $prefill) (eq $coord $decode) (and $decode (eq $prefill $decode)) }}
{{- fail "tls.identities: coordinator, prefill and decode must differ" }}
{{- end }}
{{- if has $t.serverName (list $coord $prefill $decode) }}
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
