{{/*
A worker pool: Deployment, headless Service and PodDisruptionBudget.
Call with (dict "root" $ "component" "prefill" "binary" "prefill-worker"
"name" <deployment name> "pool" <pool values> "args" <role flags>).
The elastic pool adds: "selector" (its selector labels, a dict: the pool,
not the role), "podComponent" (the role label its pods start with),
"natsUser" and "authRole" (the NATS user and the gRPC credentials' role,
default component) and "service" false (its pods are in the Service of
their live role, not one of their own). With elastic.enabled, the fixed
pools' budgets leave the elastic pods out (a pod under two budgets cannot
be evicted).
*/}}
{{- define "pdserve.workerPool" -}}
{{- $root := .root }}
{{- $pool := .pool }}
{{- $component := .component }}
{{- $selector := .selector | default (include "pdserve.selectorLabels" (dict "root" $root "component" $component) | fromYaml) }}
{{- $podComponent := .podComponent | default $component }}
{{- $natsUser := .natsUser | default $component }}
{{- $authRole := .authRole | default $component }}
{{- $engine := include "pdserve.poolEngine" (dict "root" $root "pool" $pool) | fromYaml }}
{{- if ne (eq $engine.type "llamacpp") (eq $root.Values.engine.type "llamacpp") }}
{{- fail (printf "%s: engine.type llamacpp is release-wide: set it in engine.type, not in a pool's engine" $component) }}
{{- end }}
{{- $args := list
  (printf "--grpc-addr=:%s" (include "pdserve.fmt" $pool.grpcPort))
  (printf "--advertise-addr=$(POD_IP):%s" (include "pdserve.fmt" $pool.grpcPort))
  "--id=$(POD_NAME)"
  (printf "--metrics-addr=:%s" (include "pdserve.fmt" $pool.metricsPort))
  "--nats-url=$(NATS_URL)"
  (printf "--log-level=%s" $root.Values.logLevel) }}
{{- $args = concat $args (include "pdserve.natsAuthArgs" (dict "root" $root "user" $natsUser) | fromYamlArray) }}
{{- $args = concat $args (include "pdserve.tracingArgs" $root | fromYamlArray) }}
{{- /* Drain in-flight work within the grace period: what is left after the
preStop sleep, less 5 s to exit. */}}
{{- $drain := sub (sub (int64 $pool.terminationGracePeriodSeconds) (int64 $pool.preStopSleepSeconds)) 5 }}
{{- if lt $drain 1 }}
{{- fail (printf "%s: terminationGracePeriodSeconds must exceed preStopSleepSeconds + 5" $component) }}
{{- end }}
{{- $args = append $args (printf "--drain-timeout=%ds" $drain) }}
{{- $args = concat $args (include "pdserve.engineFlags" (dict "root" $root "engine" $engine) | fromYamlArray) .args }}
{{- if $root.Values.tls.enabled }}
{{- $args = concat $args (list "--tls-cert=/etc/pdserve/tls/tls.crt" "--tls-key=/etc/pdserve/tls/tls.key" "--tls-ca=/etc/pdserve/tls/ca.crt" (printf "--tls-server-name=%s" $root.Values.tls.serverName)) }}
{{- end }}
{{- $args = concat $args (include "pdserve.grpcAuthArgs" (dict "root" $root "role" $authRole) | fromYamlArray) }}
{{- $args = concat $args (include "pdserve.kvHashKeyArgs" $root | fromYamlArray) }}
{{- $args = concat $args $pool.extraArgs }}
{{- $gpus := int64 $pool.gpus }}
{{- $gpuResource := $root.Values.gpuResource }}
{{- $resources := deepCopy (default dict $pool.resources) }}
{{- range $kind := list "limits" "requests" }}
{{- if hasKey (default dict (index $resources $kind)) $gpuResource }}
{{- fail (printf "%s: resources.%s names %s: set the pool's gpus instead" $component $kind $gpuResource) }}
{{- end }}
{{- end }}
{{- if gt $gpus 0 }}
{{- $_ := set $resources "limits" (merge (dict $gpuResource $gpus) (default dict $resources.limits)) }}
{{- $_ := set $resources "requests" (merge (dict $gpuResource $gpus) (default dict $resources.requests)) }}
{{- end }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "pdserve.labels" (dict "root" $root "component" $component) | nindent 4 }}
spec:
  replicas: {{ include "pdserve.fmt" $pool.replicas }}
  selector:
    matchLabels:
      {{- toYaml $selector | nindent 6 }}
  strategy:
    type: RollingUpdate
    rollingUpdate:
      # A GPU pool rarely has a spare GPU for a surge pod: replace one at a time.
      maxUnavailable: 1
      maxSurge: 0
  template:
    metadata:
      labels:
        {{- include "pdserve.labels" (dict "root" $root "component" $podComponent) | nindent 8 }}
        {{- if .selector }}
        {{- omit $selector "app.kubernetes.io/name" "app.kubernetes.io/instance" | toYaml | nindent 8 }}
        {{- end }}
        {{- with $pool.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- $annotations := merge (include "pdserve.tlsPodAnnotation" $root | fromYaml) (default dict $pool.podAnnotations) }}
      {{- with $annotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      automountServiceAccountToken: false
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $pool.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- with $pool.runtimeClassName }}
      runtimeClassName: {{ . }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      terminationGracePeriodSeconds: {{ include "pdserve.fmt" $pool.terminationGracePeriodSeconds }}
      {{- with $pool.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $pool.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $pool.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with include "pdserve.topologySpread" (dict "root" $root "component" $component "pool" $pool "selector" .selector) | trim }}
      {{- . | nindent 6 }}
      {{- end }}
      {{- with include "pdserve.modelInit" $root | trim }}
      initContainers:
        {{- . | nindent 8 }}
      {{- end }}
      containers:
        - name: {{ .binary }}
          {{- include "pdserve.componentImage" (dict "root" $root "image" $pool.image "llamacpp" $root.Values.image.llamacpp "binary" .binary) | nindent 10 }}
          args:
            {{- toYaml $args | nindent 12 }}
          env:
            {{- include "pdserve.podEnv" $root | trim | nindent 12 }}
            {{- include "pdserve.natsEnv" $root | trim | nindent 12 }}
            {{- with include "pdserve.llamacppEnv" (dict "root" $root "llamacpp" $root.Values.image.llamacpp) | trim }}
            {{- . | nindent 12 }}
            {{- end }}
            {{- with $pool.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - name: grpc
              containerPort: {{ include "pdserve.fmt" $pool.grpcPort }}
              protocol: TCP
            - name: metrics
              containerPort: {{ include "pdserve.fmt" $pool.metricsPort }}
              protocol: TCP
          startupProbe:
            httpGet:
              path: /healthz
              port: metrics
            periodSeconds: 2
            # Building an engine (synthetic weights or a profile) may take a
            # while; loading a GGUF model from a volume onto the GPU longer.
            failureThreshold: {{ ternary 900 150 (eq $engine.type "llamacpp") }}
          livenessProbe:
            httpGet:
              path: /healthz
              port: metrics
            periodSeconds: 10
            timeoutSeconds: 3
            failureThreshold: 3
          readinessProbe:
            httpGet:
              path: /readyz
              port: metrics
            periodSeconds: 5
            timeoutSeconds: 3
            failureThreshold: 2
          {{- if gt (int64 $pool.preStopSleepSeconds) 0 }}
          lifecycle:
            preStop:
              sleep:
                seconds: {{ include "pdserve.fmt" $pool.preStopSleepSeconds }}
          {{- end }}
          resources:
            {{- toYaml $resources | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            {{- with include "pdserve.natsAuthMount" $root | trim }}
            {{- . | nindent 12 }}
            {{- end }}
            {{- if $root.Values.tls.enabled }}
            - name: tls
              mountPath: /etc/pdserve/tls
              readOnly: true
            {{- end }}
            {{- with include "pdserve.grpcTokenMount" $root | trim }}
            {{- . | nindent 12 }}
            {{- end }}
            {{- with include "pdserve.kvHashKeyMount" $root | trim }}
            {{- . | nindent 12 }}
            {{- end }}
            {{- with include "pdserve.modelMount" $root | trim }}
            {{- . | nindent 12 }}
            {{- end }}
      volumes:
        - name: tmp
          emptyDir:
            sizeLimit: 256Mi
        {{- with include "pdserve.natsAuthVolume" (dict "root" $root "user" $natsUser) | trim }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with include "pdserve.modelVolume" $root | trim }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- if $root.Values.tls.enabled }}
        - name: tls
          secret:
            secretName: {{ include "pdserve.tlsSecret" (dict "root" $root "role" $authRole) }}
        {{- end }}
        {{- with include "pdserve.grpcTokenVolume" (dict "root" $root "role" $authRole) | trim }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with include "pdserve.kvHashKeyVolume" $root | trim }}
        {{- . | nindent 8 }}
        {{- end }}
{{- if or (not (hasKey . "service")) .service }}
---
# Headless: workers are found through NATS heartbeats, this Service names
# their ports for monitoring and DNS.
apiVersion: v1
kind: Service
metadata:
  name: {{ .name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "pdserve.labels" (dict "root" $root "component" $component) | nindent 4 }}
spec:
  clusterIP: None
  publishNotReadyAddresses: false
  selector:
    {{- include "pdserve.selectorLabels" (dict "root" $root "component" $component) | nindent 4 }}
  ports:
    - name: grpc
      port: {{ include "pdserve.fmt" $pool.grpcPort }}
      targetPort: grpc
      protocol: TCP
      appProtocol: grpc
    - name: metrics
      port: {{ include "pdserve.fmt" $pool.metricsPort }}
      targetPort: metrics
      protocol: TCP
      appProtocol: http
{{- end }}
{{- if $pool.pdb.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ .name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "pdserve.labels" (dict "root" $root "component" $component) | nindent 4 }}
spec:
  maxUnavailable: {{ include "pdserve.fmt" $pool.pdb.maxUnavailable }}
  selector:
    matchLabels:
      {{- toYaml $selector | nindent 6 }}
    {{- if and $root.Values.elastic.enabled (not .selector) }}
    matchExpressions:
      - {key: pdserve.io/pool, operator: DoesNotExist}
    {{- end }}
{{- end }}
{{- end }}
