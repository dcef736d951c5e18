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

{{/*
"true" when the coordinator calls the Kubernetes API (the planner's
kubernetes actuator, or the elastic pool's role labels), else "false".
*/}}
{{- define "pdserve.coordinatorUsesAPI" -}}
{{- or (eq .Values.coordinator.planner.actuator "kubernetes") .Values.elastic.enabled }}
{{- end }}

{{- define "pdserve.elasticName" -}}
{{ include "pdserve.fullname" . }}-elastic
{{- end }}

{{/*
Selector labels of the elastic pool's pods: their role label
(app.kubernetes.io/component) changes with the role they have now (the
coordinator patches it), so the pool is selected by pdserve.io/pool
(pkg/planner/actuator.PoolLabel) instead.
*/}}
{{- define "pdserve.elasticSelectorLabels" -}}
app.kubernetes.io/name: {{ include "pdserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
pdserve.io/pool: elastic
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
Reference of a pdserve image: REGISTRY/REPOSITORY:TAG, the registry the
image's own or else image.registry (neither: REPOSITORY:TAG), the tag the
image's own or else the chart's appVersion. Call with (dict "root" $
"image" .Values.coordinator.image).
*/}}
{{- define "pdserve.image" -}}
{{- $registry := default .root.Values.image.registry .image.registry | trimSuffix "/" }}
{{- $repo := .image.repository }}
{{- if $registry }}
{{- $repo = printf "%s/%s" $registry $repo }}
{{- end }}
{{- printf "%s:%s" $repo (default .root.Chart.AppVersion .image.tag) }}
{{- end }}

{{/*
Reference of an image that is not pdserve's (NATS, the model download):
its own registry only, then REPOSITORY:TAG. Call with the image's values.
*/}}
{{- define "pdserve.externalImage" -}}
{{- if .registry }}
{{- printf "%s/%s:%s" (trimSuffix "/" .registry) .repository .tag }}
{{- else }}
{{- printf "%s:%s" .repository .tag }}
{{- end }}
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
Engine flags of one worker pool as a YAML list. Call with (dict "root" $
"engine" <merged engine settings>): the top-level engine overridden by the
pool's own.
*/}}
{{- define "pdserve.engineFlags" -}}
{{- $e := .engine }}
{{- $pairs := list (list "--engine" $e.type) }}
{{- if eq $e.type "ref" }}
{{- $pairs = append $pairs (list "--preset" $e.preset) }}
{{- $pairs = append $pairs (list "--seed" $e.seed) }}
{{- $pairs = append $pairs (list "--engine-threads" $e.threads) }}
{{- else if eq $e.type "sim" }}
{{- $pairs = append $pairs (list "--profile" $e.profile) }}
{{- $pairs = append $pairs (list "--time-scale" $e.timeScale) }}
{{- $pairs = append $pairs (list "--payload-scale" $e.payloadScale) }}
{{- else if eq $e.type "llamacpp" }}
{{- $l := default dict $e.llamacpp }}
{{- $pairs = append $pairs (list "--model" (include "pdserve.modelPath" .root)) }}
{{- $pairs = append $pairs (list "--gpu-layers" $l.gpuLayers) }}
{{- $pairs = append $pairs (list "--ctx-size" $l.ctxSize) }}
{{- $pairs = append $pairs (list "--kv-type" $l.kvType) }}
{{- $pairs = append $pairs (list "--max-seqs" $l.maxSeqs) }}
{{- $pairs = append $pairs (list "--engine-threads" $l.threads) }}
{{- end }}
{{- include "pdserve.flags" $pairs }}
{{- end }}

{{/*
"true" when the release runs the llamacpp engine (a release-wide choice:
the schema keeps the pools from switching it), else "".
*/}}
{{- define "pdserve.llamacpp" -}}
{{- if eq .Values.engine.type "llamacpp" }}true{{ end }}
{{- end }}

{{/*
Path of the GGUF model file inside the containers.
*/}}
{{- define "pdserve.modelPath" -}}
{{- $m := .Values.model }}
{{- printf "%s/%s" (trimSuffix "/" $m.mountPath) (required "model.file is required with engine.type=llamacpp" $m.file) }}
{{- end }}

{{/*
Image fields of a pdserve container: the component's own image, or with
the llamacpp engine the llama.cpp image, which holds all three binaries,
and then the command that names the binary. Call with (dict "root" $
"image" <the component's own image> "llamacpp" <image.llamacpp or
image.llamacppCPU> "binary" <binary name>).
*/}}
{{- define "pdserve.componentImage" -}}
{{- if include "pdserve.llamacpp" .root -}}
image: {{ include "pdserve.image" (dict "root" .root "image" .llamacpp) }}
imagePullPolicy: {{ .llamacpp.pullPolicy }}
command: [{{ printf "/usr/local/bin/%s" .binary | quote }}]
{{- else -}}
image: {{ include "pdserve.image" (dict "root" .root "image" .image) }}
imagePullPolicy: {{ .image.pullPolicy }}
{{- end }}
{{- end }}

{{/*
Environment of a pdserve container for the llamacpp engine: where the
image keeps libllama and libggml*. Call with (dict "root" $ "llamacpp"
<image.llamacpp or image.llamacppCPU>); empty without llamacpp.
*/}}
{{- define "pdserve.llamacppEnv" -}}
{{- if include "pdserve.llamacpp" .root }}
- name: PDSERVE_LLAMA_LIB
  value: {{ .llamacpp.libDir | quote }}
{{- end }}
{{- end }}

{{/*
Volume mount of the model, read-only; empty without llamacpp.
*/}}
{{- define "pdserve.modelMount" -}}
{{- if include "pdserve.llamacpp" . }}
{{- $m := .Values.model }}
- name: model
  mountPath: {{ $m.mountPath }}
  readOnly: true
  {{- if and (ne $m.source "hostPath") $m.pvc.subPath (or (eq $m.source "pvc") (eq $m.download.into "pvc")) }}
  subPath: {{ $m.pvc.subPath }}
  {{- end }}
{{- end }}
{{- end }}

{{/*
The model volume; empty without llamacpp.
*/}}
{{- define "pdserve.modelVolume" -}}
{{- if include "pdserve.llamacpp" . }}
{{- $m := .Values.model }}
- name: model
  {{- if or (eq $m.source "pvc") (and (eq $m.source "download") (eq $m.download.into "pvc")) }}
  persistentVolumeClaim:
    claimName: {{ required "model.pvc.claimName is required" $m.pvc.claimName }}
    {{- if eq $m.source "pvc" }}
    readOnly: true
    {{- end }}
  {{- else if eq $m.source "hostPath" }}
  hostPath:
    path: {{ required "model.hostPath.path is required" $m.hostPath.path }}
    type: Directory
  {{- else if eq $m.source "download" }}
  emptyDir:
    sizeLimit: {{ $m.download.sizeLimit }}
  {{- else }}
  {{- fail "model.source must be pvc, hostPath or download with engine.type=llamacpp" }}
  {{- end }}
{{- end }}
{{- end }}

{{/*
Init containers of a pod that reads the model: with model.source
download, one that fetches model.download.url into the model volume
(skipped when the file is already there, as on a shared PVC). The token,
if any, comes from the Secret into the environment and reaches curl as a
config line on its standard input, so it is in no command line. The file
is written under a temporary name and renamed when complete (and its
SHA-256 checked, if given), so that a reader never sees a partial file.
*/}}
{{- define "pdserve.modelInit" -}}
{{- $m := .Values.model }}
{{- if and (include "pdserve.llamacpp" .) (eq $m.source "download") }}
{{- $d := $m.download }}
- name: model-download
  image: {{ include "pdserve.externalImage" $d.image }}
  imagePullPolicy: {{ $d.image.pullPolicy }}
  command: ["/bin/sh", "-c"]
  args:
    - |
      {{- include "pdserve.downloadScript" . | nindent 6 }}
  env:
    - name: MODEL_URL
      value: {{ required "model.download.url is required with model.source=download" $d.url | quote }}
    - name: MODEL_DEST
      value: {{ include "pdserve.modelPath" . | quote }}
    - name: MODEL_SHA256
      value: {{ $d.sha256 | quote }}
    {{- if $d.tokenSecret.name }}
    - name: MODEL_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ $d.tokenSecret.name }}
          key: {{ $d.tokenSecret.key }}
    {{- end }}
  resources:
    {{- toYaml $d.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: model
      mountPath: {{ $m.mountPath }}
      {{- if and (eq $d.into "pvc") $m.pvc.subPath }}
      subPath: {{ $m.pvc.subPath }}
      {{- end }}
{{- end }}
{{- end }}

{{/*
The model download, a POSIX sh script over the environment of
pdserve.modelInit (MODEL_URL, MODEL_DEST, MODEL_SHA256, MODEL_TOKEN).
*/}}
{{- define "pdserve.downloadScript" -}}
set -eu
if [ -s "$MODEL_DEST" ]; then
  echo "model: $MODEL_DEST is present"
  exit 0
fi
mkdir -p "$(dirname "$MODEL_DEST")"
part="$MODEL_DEST.part-${HOSTNAME:-$$}"
trap 'rm -f "$part"' EXIT
echo "model: downloading $MODEL_URL"
{ if [ -n "${MODEL_TOKEN:-}" ]; then printf 'header = "Authorization: Bearer %s"\n' "$MODEL_TOKEN"; fi; } |
  curl -q --config - --fail --location --retry 5 --retry-connrefused --silent --show-error --output "$part" "$MODEL_URL"
if [ -n "${MODEL_SHA256:-}" ]; then
  echo "$MODEL_SHA256  $part" | sha256sum -c -
fi
mv -f "$part" "$MODEL_DEST"
trap - EXIT
echo "model: $MODEL_DEST ready"
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
        {{- if .selector }}
        {{- toYaml .selector | nindent 8 }}
        {{- else }}
        {{- include "pdserve.selectorLabels" (dict "root" .root "component" .component) | nindent 8 }}
        {{- end }}
{{- end }}
{{- with .pool.topologySpreadConstraints }}
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Trace export flags of every pdserve binary as a YAML list: none while
tracing.endpoint is empty.
*/}}
{{- define "pdserve.tracingArgs" -}}
{{- $t := .Values.tracing }}
{{- $out := list }}
{{- if $t.endpoint }}
{{- $out = list (printf "--otel-endpoint=%s" $t.endpoint) (printf "--otel-protocol=%s" $t.protocol) }}
{{- if not (kindIs "invalid" $t.sampleRatio) }}
{{- $out = append $out (printf "--otel-sample-ratio=%s" (include "pdserve.fmt" $t.sampleRatio)) }}
{{- end }}
{{- end }}
{{- toYaml $out }}
{{- end }}
