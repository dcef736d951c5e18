{{/*
Chart name, truncated to a DNS label.
*/}}
{{- define "pdserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Object-name prefix: "<release>-pdserve" (or fullnameOverride). Truncated so
that "<prefix>-coordinator" still fits a 63-character DNS label. The planner's
Kubernetes actuator finds the worker Deployments as "<prefix>-prefill" and
"<prefix>-decode" (passed as --planner-prefill-deployment and
--planner-decode-deployment).
*/}}
{{- define "pdserve.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "pdserve.name" .) | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "pdserve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Common labels. Call with (dict "root" $ "component" "coordinator").
*/}}
{{- define "pdserve.labels" -}}
helm.sh/chart: {{ include "pdserve.chart" .root }}
{{ include "pdserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: pdserve
{{- end }}

{{/*
Selector labels. Call with (dict "root" $ "component" "coordinator").
*/}}
{{- define "pdserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pdserve.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "pdserve.coordinatorName" -}}
{{ include "pdserve.fullname" . }}-coordinator
{{- end }}

{{- define "pdserve.prefillName" -}}
{{ include "pdserve.fullname" . }}-prefill
{{- end }}

{{- define "pdserve.decodeName" -}}
{{ include "pdserve.fullname" . }}-decode
{{- end }}

{{- define "pdserve.natsName" -}}
{{ include "pdserve.fullname" . }}-nats
{{- end }}

{{- define "pdserve.serviceAccountName" -}}
{{- if .Values.coordinator.serviceAccount.create }}
{{- default (include "pdserve.coordinatorName" .) .Values.coordinator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.coordinator.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Image reference. Call with (dict "root" $ "image" .Values.coordinator.image).
*/}}
{{- define "pdserve.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) }}
{{- end }}

{{/*
Secret holding the coordinator's policy file when API keys are configured,
or "" when the policy lives in the ConfigMap.
*/}}
{{- define "pdserve.policySecret" -}}
{{- if .Values.apiKeys.existingSecret }}
{{- .Values.apiKeys.existingSecret }}
{{- else if .Values.apiKeys.keys }}
{{- include "pdserve.fullname" . }}-policy
{{- end }}
{{- end }}

{{/*
The coordinator's policy with the chart-managed API keys merged in.
*/}}
{{- define "pdserve.policy" -}}
{{- $p := deepCopy .Values.coordinator.policy }}
{{- if .Values.apiKeys.keys }}
{{- $b := default dict $p.prompt_budgets }}
{{- $_ := set $b "api_keys" .Values.apiKeys.keys }}
{{- $_ := set $p "prompt_budgets" $b }}
{{- end }}
{{- toYaml $p }}
{{- end }}

{{/*
The NATS_URL environment variable every pdserve container reads its
--nats-url from.
*/}}
{{- define "pdserve.natsEnv" -}}
{{- if .Values.nats.bundled }}
- name: NATS_URL
  value: {{ printf "nats://%s:4222" (include "pdserve.natsName" .) | quote }}
{{- else if .Values.nats.external.existingSecret }}
- name: NATS_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.nats.external.existingSecret }}
      key: {{ .Values.nats.external.urlKey }}
{{- else if .Values.nats.external.url }}
- name: NATS_URL
  value: {{ .Values.nats.external.url | quote }}
{{- else }}
{{- fail "nats: set nats.bundled=true, nats.external.url or nats.external.existingSecret" }}
{{- end }}
{{- end }}

{{/*
Format a scalar value for a flag: whole numbers (float64 after YAML
decoding) print without an exponent.
*/}}
{{- define "pdserve.fmt" -}}
{{- if and (kindIs "float64" .) (eq . (floor .)) }}
{{- int64 . }}
{{- else }}
{{- toString . }}
{{- end }}
{{- end }}

{{/*
Flags "--name=value" for every (list "--name" value) pair whose value is not
null, as a YAML list. Call with a list of pairs; read back with fromYamlArray.
*/}}
{{- define "pdserve.flags" -}}
{{- $out := list }}
{{- range $f := . }}
{{- $v := index $f 1 }}
{{- if not (kindIs "invalid" $v) }}
{{- $out = append $out (printf "%s=%s" (index $f 0) (include "pdserve.fmt" $v)) }}
{{- end }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/*
Engine flags of one component as a YAML list. Call with the merged engine
settings (top-level engine overridden by the component's own).
*/}}
{{- define "pdserve.engineFlags" -}}
{{- $pairs := list (list "--engine" .type) }}
{{- if eq .type "ref" }}
{{- $pairs = append $pairs (list "--preset" .preset) }}
{{- $pairs = append $pairs (list "--seed" .seed) }}
{{- $pairs = append $pairs (list "--engine-threads" .threads) }}
{{- else if eq .type "sim" }}
{{- $pairs = append $pairs (list "--profile" .profile) }}
{{- $pairs = append $pairs (list "--time-scale" .timeScale) }}
{{- $pairs = append $pairs (list "--payload-scale" .payloadScale) }}
{{- end }}
{{- include "pdserve.flags" $pairs }}
{{- end }}

{{/*
Merged engine settings of a pool. Call with (dict "root" $ "pool" .Values.prefillWorker).
*/}}
{{- define "pdserve.poolEngine" -}}
{{- toYaml (mergeOverwrite (deepCopy .root.Values.engine) (deepCopy (default dict .pool.engine))) }}
{{- end }}

{{/*
Standard downward-API environment of every pdserve container.
*/}}
{{- define "pdserve.podEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end }}

{{/*
Topology spread constraints of a component. Call with
(dict "root" $ "component" "prefill" "pool" .Values.prefillWorker).
*/}}
{{- define "pdserve.topologySpread" -}}
{{- $ts := .pool.topologySpread }}
{{- if or $ts.enabled .pool.topologySpreadConstraints }}
topologySpreadConstraints:
{{- if $ts.enabled }}
  - maxSkew: {{ $ts.maxSkew }}
    topologyKey: {{ $ts.topologyKey }}
    whenUnsatisfiable: {{ $ts.whenUnsatisfiable }}
    labelSelector:
      matchLabels:
        {{- include "pdserve.selectorLabels" (dict "root" .root "component" .component) | nindent 8 }}
{{- end }}
{{- with .pool.topologySpreadConstraints }}
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- end }}
