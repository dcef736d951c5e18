{{/*
Regions (docs/regions.md): with region.name set, the release is one region
of several. The coordinator gets --region, --region-advertise-url and the
forwarding TLS files from region.tlsSecret; the bundled NATS server gets a
gateway named after the region, listening on region.gateway.port (Service
<fullname>-nats-gateway), dialing region.gateway.peers, over mutual TLS
with the same Secret. With region.name "" nothing here renders.
*/}}

{{/*
Where the region's TLS Secret is mounted, in the coordinator and the NATS
pod.
*/}}
{{- define "pdserve.regionTLSDir" -}}
/etc/pdserve/region-tls
{{- end }}

{{/*
Name of the Service of the bundled NATS server's gateway listener.
*/}}
{{- define "pdserve.natsGatewayName" -}}
{{ include "pdserve.natsName" . }}-gateway
{{- end }}

{{/*
Checks of the region settings the schema cannot make: peers named once,
none after this region; a gateway needs the bundled NATS server, which
then runs without JetStream; the NetworkPolicies do not know the regions' flows yet. Renders nothing.
*/}}
{{- define "pdserve.regionCheck" -}}
{{- $r := .Values.region }}
{{- if $r.name }}
{{- $seen := dict }}
{{- range $p := $r.gateway.peers }}
{{- if eq $p.name $r.name }}
{{- fail (printf "region.gateway.peers: %s is this region (region.name); list the other regions" $p.name) }}
{{- end }}
{{- if hasKey $seen $p.name }}
{{- fail (printf "region.gateway.peers: %s is listed twice" $p.name) }}
{{- end }}
{{- $_ := set $seen $p.name true }}
{{- end }}
{{- if and $r.gateway.peers (not .Values.nats.bundled) }}
{{- fail "region.gateway.peers: the chart configures the gateway of the bundled NATS server only; with nats.bundled=false configure the gateways on your server and leave region.gateway.peers empty" }}
{{- end }}
{{- if and .Values.nats.bundled .Values.nats.jetstream }}
{{- fail "region.name with the bundled NATS server needs nats.jetstream=false: a server with a gateway runs JetStream only clustered, and the meta group of one-node regions would span the regions and stop when one of them fails (stored responses are off without it)" }}
{{- end }}
{{- if .Values.networkPolicy.enabled }}
{{- fail "region.name with networkPolicy.enabled: the NetworkPolicies do not yet allow the gateway and forwarded requests between regions; set networkPolicy.enabled=false" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The coordinator's region flags as a YAML list (read back with
fromYamlArray); none without a region.
*/}}
{{- define "pdserve.regionArgs" -}}
{{- $r := .Values.region }}
{{- $args := list }}
{{- if $r.name }}
{{- $dir := include "pdserve.regionTLSDir" . }}
{{- $args = list (printf "--region=%s" $r.name) (printf "--region-advertise-url=%s" $r.advertiseURL)
  (printf "--region-tls-cert=%s/tls.crt" $dir) (printf "--region-tls-key=%s/tls.key" $dir) (printf "--region-tls-ca=%s/ca.crt" $dir) }}
{{- end }}
{{- toYaml $args }}
{{- end }}

{{/*
Volume mount of the region's TLS Secret; empty without a region.
*/}}
{{- define "pdserve.regionTLSMount" -}}
{{- if .Values.region.name }}
- name: region-tls
  mountPath: {{ include "pdserve.regionTLSDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/*
Volume of the region's TLS Secret (its three keys); empty without a
region.
*/}}
{{- define "pdserve.regionTLSVolume" -}}
{{- if .Values.region.name }}
- name: region-tls
  secret:
    secretName: {{ .Values.region.tlsSecret }}
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
      - key: ca.crt
        path: ca.crt
{{- end }}
{{- end }}

{{/*
The gateway block of the bundled NATS server's config; empty without a
region. nats-server always verifies both ends of a gateway's TLS (there is
no verify setting to make): every region's certificate must name the host
of its gateway URL, serve client and server authentication, and be signed
by the CA in every region's ca.crt.
*/}}
{{- define "pdserve.natsGateway" -}}
{{- $r := .Values.region }}
{{- if $r.name }}
{{- $dir := include "pdserve.regionTLSDir" . }}
# This region's gateway in the super-cluster of the regions' servers.
gateway {
  name: {{ $r.name | quote }}
  listen: {{ printf "0.0.0.0:%s" (include "pdserve.fmt" $r.gateway.port) | quote }}
  tls {
    cert_file: {{ printf "%s/tls.crt" $dir | quote }}
    key_file: {{ printf "%s/tls.key" $dir | quote }}
    ca_file: {{ printf "%s/ca.crt" $dir | quote }}
    timeout: 2
  }
  {{- with $r.gateway.peers }}
  gateways: [
    {{- range $p := . }}
    {name: {{ $p.name | quote }}, urls: [{{ $p.url | quote }}]}
    {{- end }}
  ]
  {{- end }}
}
{{- end }}
{{- end }}
