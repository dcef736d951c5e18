{{/*
Regions (docs/regions.md): with region.name set, the release is one region
of several. The coordinator gets --region, --region-advertise-url and the
forwarding TLS files from region.tlsSecret. The NATS pod gets a second
nats-server, the region's gateway (as pkg/control.StartGateway starts it
beside a coordinator's embedded server): a gateway named after the region,
listening on region.gateway.port (Service <fullname>-nats-gateway),
dialing region.gateway.peers, over mutual TLS with the same Secret. The
bundled server keeps its own config (JetStream included) and connects to
the gateway server as a leaf node over the pod's loopback; only the region
subjects (pdserve.region.>) cross between the two, so heartbeats,
commands, KV events, plans and JetStream stay in the region. With
region.name "" nothing here renders.
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
Name of the Service of the coordinator's forwarding listener.
*/}}
{{- define "pdserve.regionServiceName" -}}
{{ include "pdserve.coordinatorName" . }}-region
{{- end }}

{{/*
Port of the coordinator's forwarding listener: the advertise URL's (the
coordinator binds the port of --region-advertise-url), which the schema
requires.
*/}}
{{- define "pdserve.regionPort" -}}
{{- regexFind "[0-9]+$" .Values.region.advertiseURL }}
{{- end }}

{{/*
Checks of the region settings the schema cannot make: peers named once,
none after this region; a gateway needs the bundled NATS server; the NetworkPolicies do not know the regions' flows yet. Renders nothing.
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
{{- if eq (include "pdserve.regionPort" .) (toString .Values.coordinator.httpPort) }}
{{- fail (printf "region.advertiseURL: port %s is coordinator.httpPort; the forwarding listener needs a port of its own" (include "pdserve.regionPort" .)) }}
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
The subjects that never leave a region (pkg/control's regionLocal): the
workers' heartbeats, commands and KV events, plans, replies, JetStream.
The bundled server's leafnode remote denies them both ways.
*/}}
{{- define "pdserve.regionLocalSubjects" -}}
{{- toYaml (list "pdserve.hb.>" "pdserve.cmd.>" "pdserve.kv.>" "pdserve.plan" "_INBOX.>" "$JS.>" "$KV.>" "$SYS.>") }}
{{- end }}

{{/*
Loopback port of the gateway server's leafnode listener, which only the
bundled server in the same pod dials.
*/}}
{{- define "pdserve.regionLeafPort" -}}
7422
{{- end }}

{{/*
Monitoring port of the gateway server (its probes).
*/}}
{{- define "pdserve.regionGatewayMonitorPort" -}}
8223
{{- end }}

{{/*
The leafnode remote of the bundled NATS server's config: the gateway
server in the same pod, the region's own subjects denied both ways; empty
without a region.
*/}}
{{- define "pdserve.natsRegionLeaf" -}}
{{- if .Values.region.name }}
{{- $local := list }}
{{- range include "pdserve.regionLocalSubjects" . | fromYamlArray }}
{{- $local = append $local (quote .) }}
{{- end }}
# The region's gateway server (container gateway of this pod): only
# pdserve.region.> crosses to the other regions.
leafnodes {
  remotes = [
    {
      url: {{ printf "nats://127.0.0.1:%s" (include "pdserve.regionLeafPort" .) | quote }}
      deny_imports: [{{ join ", " $local }}]
      deny_exports: [{{ join ", " $local }}]
    }
  ]
}
{{- end }}
{{- end }}

{{/*
The config of the region's gateway server (container gateway of the NATS
pod), as pkg/control.StartGateway configures it; empty without a region.
No client logs in: its client port listens on loopback and takes only the
leaf user, which is allowed leafnode connections and the region subjects
only. nats-server always verifies both ends of a gateway's TLS (there is
no verify setting to make): every region's certificate must name the host
of its gateway URL, serve client and server authentication, and be signed
by the CA in every region's ca.crt.
*/}}
{{- define "pdserve.natsGatewayConfig" -}}
{{- $r := .Values.region }}
{{- if $r.name }}
{{- $dir := include "pdserve.regionTLSDir" . }}
server_name: {{ printf "pdserve-region-gateway-%s" $r.name | quote }}
listen: "127.0.0.1:4223"
http: {{ printf "0.0.0.0:%s" (include "pdserve.regionGatewayMonitorPort" .) | quote }}
lame_duck_duration: "30s"
lame_duck_grace_period: "5s"
# The bundled server (same pod) connects as a leaf node, without
# credentials: as the leaf user, which may send and receive the region
# subjects only.
authorization {
  users = [
    {
      user: "region-leaf"
      allowed_connection_types: ["LEAFNODE"]
      permissions: {
        publish: {allow: ["pdserve.region.>"]}
        subscribe: {allow: ["pdserve.region.>"]}
      }
    }
  ]
}
no_auth_user: "region-leaf"
# nats-server requires a system account with leaf nodes and gateways.
accounts {
  SYS: {}
}
system_account: "SYS"
leafnodes {
  listen: {{ printf "127.0.0.1:%s" (include "pdserve.regionLeafPort" .) | quote }}
}
# This region's gateway in the super-cluster of the regions' gateway
# servers.
gateway {
  name: {{ $r.name | quote }}
  listen: {{ printf "0.0.0.0:%s" (include "pdserve.fmt" $r.gateway.port) | quote }}
  tls {
    cert_file: {{ printf "%s/tls.crt" $dir | quote }}
    key_file: {{ printf "%s/tls.key" $dir | quote }}
    ca_file: {{ printf "%s/ca.crt" $dir | quote }}
    # A region's link may be slow and its host loaded.
    timeout: 10
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
