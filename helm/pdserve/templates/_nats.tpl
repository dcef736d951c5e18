{{/*
Credentials of the bundled NATS server. One user per role, named after it:
coordinator, prefill, decode, and elastic with elastic.enabled. The server's config (nats.yaml) gives each
the permissions of pkg/control.Permissions for its role with any worker id
(the pods of a pool share the user); its passwords come from the auth
Secret, whose keys are <user>.password. Each pdserve pod mounts only its
own key, as the file --nats-password-file names.
*/}}

{{/*
Name of the Secret with the bundled server's passwords:
nats.auth.existingSecret, or the chart's own (nats-auth-secret.yaml).
*/}}
{{- define "pdserve.natsAuthSecret" -}}
{{- default (printf "%s-nats-auth" (include "pdserve.fullname" .)) .Values.nats.auth.existingSecret }}
{{- end }}

{{/*
The NATS users of the bundled server, as a YAML list.
*/}}
{{- define "pdserve.natsUsers" -}}
{{- $users := list "coordinator" "prefill" "decode" }}
{{- if .Values.elastic.enabled }}
{{- $users = append $users "elastic" }}
{{- end }}
{{- toYaml $users }}
{{- end }}

{{/*
Where a pod's NATS password file is mounted.
*/}}
{{- define "pdserve.natsAuthDir" -}}
/etc/pdserve/nats
{{- end }}

{{/*
The NATS credential flags of a pdserve container as a YAML list (read back
with fromYamlArray); none with an external server, whose credentials are
in its URL. Call with (dict "root" $ "user" "coordinator|prefill|decode").
*/}}
{{- define "pdserve.natsAuthArgs" -}}
{{- $args := list }}
{{- if .root.Values.nats.bundled }}
{{- $args = list (printf "--nats-user=%s" .user) (printf "--nats-password-file=%s/password" (include "pdserve.natsAuthDir" .root)) }}
{{- end }}
{{- toYaml $args }}
{{- end }}

{{/*
Volume mount of the NATS password file; empty with an external server.
*/}}
{{- define "pdserve.natsAuthMount" -}}
{{- if .Values.nats.bundled }}
- name: nats-auth
  mountPath: {{ include "pdserve.natsAuthDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/*
Volume with one user's password from the auth Secret, as the file
"password"; empty with an external server. Call with (dict "root" $ "user"
"coordinator|prefill|decode").
*/}}
{{- define "pdserve.natsAuthVolume" -}}
{{- if .root.Values.nats.bundled }}
- name: nats-auth
  secret:
    secretName: {{ include "pdserve.natsAuthSecret" .root }}
    items:
      - key: {{ .user }}.password
        path: password
{{- end }}
{{- end }}

{{/*
The authorization block of the bundled server's config. Passwords are
environment references ($PDSERVE_NATS_<USER>_PASSWORD, set in nats.yaml
from the auth Secret), so the config holds no secret. The permissions are
pkg/control.Permissions' (helm/charttest compares them).
*/}}
{{- define "pdserve.natsAuthorization" -}}
{{- $workerRole := dict "prefill" "prefill" "decode" .Values.decodeWorker.role }}
authorization {
  users = [
    {
      user: "coordinator"
      password: $PDSERVE_NATS_COORDINATOR_PASSWORD
      permissions: {
        # pdserve.cmd, the plan and the region subjects (docs/regions.md);
        # the JetStream key-value bucket of the stored responses
        # (pkg/respstore.Subjects), its stream only.
        publish: {allow: ["pdserve.cmd.>", "pdserve.plan", "pdserve.region.>", "$JS.API.INFO", "$JS.API.STREAM.INFO.KV_pdserve_responses", "$JS.API.STREAM.CREATE.KV_pdserve_responses", "$JS.API.STREAM.UPDATE.KV_pdserve_responses", "$JS.API.STREAM.MSG.GET.KV_pdserve_responses", "$JS.API.DIRECT.GET.KV_pdserve_responses", "$JS.API.DIRECT.GET.KV_pdserve_responses.>", "$KV.pdserve_responses.>"]}
        subscribe: {allow: ["pdserve.hb.>", "pdserve.kv.>", "pdserve.plan", "_INBOX.>", "pdserve.region.>"]}
      }
    }
    {{- range $user := list "prefill" "decode" }}
    {{- $role := index $workerRole $user }}
    {
      user: {{ $user | quote }}
      password: ${{ printf "PDSERVE_NATS_%s_PASSWORD" (upper $user) }}
      permissions: {
        publish: {allow: [{{ printf "pdserve.hb.%s.*" $role | quote }}, {{ printf "pdserve.kv.%s.*" $role | quote }}, {{ printf "pdserve.kv.%s.*.host" $role | quote }}, {{ printf "pdserve.kv.%s.*.disk" $role | quote }}]}
        {{- if eq $role "prefill" }}
        {{- /* the receivers' codec speeds, for the adaptive codec */}}
        subscribe: {allow: [{{ printf "pdserve.cmd.%s.*" $role | quote }}, "pdserve.hb.decode.*", "pdserve.hb.colocated.*"]}
        {{- else }}
        subscribe: {allow: [{{ printf "pdserve.cmd.%s.*" $role | quote }}]}
        {{- end }}
        allow_responses: {max: 1, expires: "1m"}
      }
    }
    {{- end }}
    {{- if .Values.elastic.enabled }}
    {{- /* control.Permissions(RoleElastic): the union of the three worker
    roles', any worker id (the pool's pods share the user). */}}
    {
      user: "elastic"
      password: $PDSERVE_NATS_ELASTIC_PASSWORD
      permissions: {
        publish: {allow: [
          {{- range $i, $role := list "prefill" "decode" "colocated" }}
          {{- if $i }}, {{ end }}{{ printf "pdserve.hb.%s.*" $role | quote }}, {{ printf "pdserve.kv.%s.*" $role | quote }}, {{ printf "pdserve.kv.%s.*.host" $role | quote }}, {{ printf "pdserve.kv.%s.*.disk" $role | quote }}
          {{- end }}]}
        subscribe: {allow: ["pdserve.cmd.prefill.*", "pdserve.hb.decode.*", "pdserve.hb.colocated.*", "pdserve.cmd.decode.*", "pdserve.cmd.colocated.*"]}
        allow_responses: {max: 1, expires: "1m"}
      }
    }
    {{- end }}
  ]
}
{{- end }}

{{/*
Environment of the NATS container: each user's password from the auth
Secret, double-quoted in a second variable so that nats-server reads it
as a string whatever its characters (a password of digits would otherwise
be a number).
*/}}
{{- define "pdserve.natsPasswordEnv" -}}
{{- $secret := include "pdserve.natsAuthSecret" . }}
{{- range $user := include "pdserve.natsUsers" . | fromYamlArray }}
- name: {{ printf "NATS_%s_PASSWORD_RAW" (upper $user) }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $user }}.password
- name: {{ printf "PDSERVE_NATS_%s_PASSWORD" (upper $user) }}
  value: {{ printf "\"$(NATS_%s_PASSWORD_RAW)\"" (upper $user) | quote }}
{{- end }}
{{- end }}
