{{/* The chart name, shortened to what a label allows. */}}
{{- define "hermes.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every resource name: <release>-<chart>, or the override.
At most 45 characters, so that with the longest suffix the chart adds
("-router-admin", "-test-readyz") every name stays within the 63 of a
DNS label (Service names must be one).
*/}}
{{- define "hermes.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 45 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 45 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels of every resource. */}}
{{- define "hermes.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "hermes.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select the release's pods; add app.kubernetes.io/component. */}}
{{- define "hermes.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hermes.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The ServiceAccount of edges and routers. */}}
{{- define "hermes.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- .Values.serviceAccount.name | default (include "hermes.fullname" .) }}
{{- else }}
{{- .Values.serviceAccount.name | default "default" }}
{{- end }}
{{- end }}

{{/* The image: by digest when image.digest is set, else by its tag
(defaulting to the chart's appVersion). */}}
{{- define "hermes.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
{{- end }}

{{/* Fails unless an autoscaling block's maxReplicas is at least its
minReplicas (the schema cannot compare two values). Call with
(list <autoscaling values> "edge.autoscaling"). */}}
{{- define "hermes.checkReplicas" -}}
{{- $a := index . 0 }}
{{- if lt (int $a.maxReplicas) (int $a.minReplicas) }}
{{- fail (printf "%s.maxReplicas (%d) is below %s.minReplicas (%d): the HorizontalPodAutoscaler would be rejected" (index . 1) (int $a.maxReplicas) (index . 1) (int $a.minReplicas)) }}
{{- end }}
{{- end }}

{{/* The Secret holding the tokens: the user's or the chart's. */}}
{{- define "hermes.secretName" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "hermes.fullname" .)) }}
{{- end }}

{{/* REDIS_URL when it goes into the ConfigMap (empty when it comes from a Secret). */}}
{{- define "hermes.redisURL" -}}
{{- if .Values.redis.bundled }}
{{- printf "redis://%s-redis:6379" (include "hermes.fullname" .) }}
{{- else if not .Values.redis.existingSecret }}
{{- required "set redis.url (or redis.existingSecret, or redis.bundled=true)" .Values.redis.url }}
{{- end }}
{{- end }}

{{/* REDIS_MODE. cluster and sentinel name an external Redis: the bundled
one is a single server (the schema cannot compare the two values). */}}
{{- define "hermes.redisMode" -}}
{{- $mode := .Values.redis.mode | default "single" }}
{{- if and .Values.redis.bundled (ne $mode "single") }}
{{- fail (printf "redis.mode %s needs an external Redis: set redis.bundled=false and redis.url (or redis.existingSecret) to the %s's URL; the bundled Redis is a single server" $mode $mode) }}
{{- end }}
{{- $mode }}
{{- end }}

{{/* NATS_URL. */}}
{{- define "hermes.natsURL" -}}
{{- if .Values.nats.bundled }}
{{- printf "nats://%s-nats:4222" (include "hermes.fullname" .) }}
{{- else }}
{{- required "set nats.url (or nats.bundled=true)" .Values.nats.url }}
{{- end }}
{{- end }}

{{/*
A secret environment variable, from the chart's Secret (when auth.<value>
is set; MOBILE_TOKEN always) or from the user's (when
auth.existingSecretKeys.<value> names a key; MOBILE_TOKEN always). Never
optional: a Secret or key that is missing keeps the pod from starting
rather than starting an edge without its token.
Call with (list $ "MOBILE_TOKEN" "token").
*/}}
{{- define "hermes.secretEnv" -}}
{{- $ := index . 0 }}
{{- $var := index . 1 }}
{{- $value := index . 2 }}
{{- $key := "" }}
{{- if $.Values.auth.existingSecret }}
{{- $key = index $.Values.auth.existingSecretKeys $value }}
{{- if eq $value "token" }}
{{- $key = required "auth.existingSecretKeys.token must name the key of MOBILE_TOKEN" $key }}
{{- end }}
{{- else if or (eq $value "token") (index $.Values.auth $value) }}
{{- $key = $var }}
{{- end }}
{{- with $key }}
- name: {{ $var }}
  valueFrom:
    secretKeyRef:
      name: {{ include "hermes.secretName" $ }}
      key: {{ . }}
{{- end }}
{{- end }}

{{/*
Bytes of a Kubernetes quantity ("512Mi", "1Gi", "1G", "1000000"), for
GOMEMLIMIT. Supports the binary and decimal suffixes memory limits use.
*/}}
{{- define "hermes.bytes" -}}
{{- $q := toString . }}
{{- $units := dict "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "K" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 }}
{{- $n := $q }}
{{- $mult := 1 }}
{{- range $suffix, $m := $units }}
{{- if hasSuffix $suffix $q }}
{{- $n = trimSuffix $suffix $q }}
{{- $mult = $m }}
{{- end }}
{{- end }}
{{- if not (regexMatch "^[0-9]+$" $n) }}
{{- fail (printf "memory limit %q: want a whole number with an optional Ki, Mi, Gi, Ti, k, M, G or T suffix" $q) }}
{{- end }}
{{- mul (atoi $n) $mult }}
{{- end }}

{{/*
Resources with the memory request raised to the limit, so the scheduler
reserves what the process may use, and the GOMEMLIMIT env entry (90 % of the
limit), so the Go runtime collects garbage harder before the kernel's OOM
killer would act. Call with a component's values; returns YAML with the
keys "resources" and "env" (a list, empty without a memory limit).
*/}}
{{- define "hermes.memory" -}}
{{- $res := deepCopy (.resources | default dict) }}
{{- $limits := $res.limits | default dict }}
{{- $env := list }}
{{- with $limits.memory }}
{{- $requests := $res.requests | default dict }}
{{- $_ := set $requests "memory" . }}
{{- $_ := set $res "requests" $requests }}
{{- $bytes := include "hermes.bytes" . | atoi }}
{{- $env = append $env (dict "name" "GOMEMLIMIT" "value" (printf "%d" (div (mul $bytes 9) 10))) }}
{{- end }}
{{- toYaml (dict "resources" $res "env" $env) }}
{{- end }}

{{/*
topologySpreadConstraints, each given this component's pods of this release
as its labelSelector (unless it has one) and matchLabelKeys
pod-template-hash, so the skew counts only the current rollout's pods of
this release, not another release's or the previous ReplicaSet's.
Call with (list $ "edge" .Values.edge.topologySpreadConstraints).
*/}}
{{- define "hermes.spread" -}}
{{- $ := index . 0 }}
{{- $component := index . 1 }}
{{- $out := list }}
{{- range index . 2 }}
{{- $c := deepCopy . }}
{{- if not $c.labelSelector }}
{{- $labels := include "hermes.selectorLabels" $ | fromYaml }}
{{- $_ := set $labels "app.kubernetes.io/component" $component }}
{{- $_ := set $c "labelSelector" (dict "matchLabels" $labels) }}
{{- end }}
{{- if not (hasKey $c "matchLabelKeys") }}
{{- $_ := set $c "matchLabelKeys" (list "pod-template-hash") }}
{{- end }}
{{- $out = append $out $c }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/* Env vars common to edges and routers that are not in the ConfigMap. */}}
{{- define "hermes.commonEnv" -}}
{{- if and (not .Values.redis.bundled) .Values.redis.existingSecret }}
- name: REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.existingSecret }}
      key: {{ .Values.redis.existingSecretKey }}
{{- end }}
{{- end }}

{{/* Pod annotations that restart the pods when their configuration changes. */}}
{{- define "hermes.checksums" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- if not .Values.auth.existingSecret }}
checksum/secret: {{ include (print .Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end }}
{{- end }}

{{/* A Prometheus duration (500ms, 15s, 1m, 1h) in milliseconds. */}}
{{- define "hermes.milliseconds" -}}
{{- $d := toString . }}
{{- $m := regexFind "^[0-9]+(ms|s|m|h)$" $d }}
{{- if not $m }}
{{- fail (printf "duration %q: want a whole number with ms, s, m or h" $d) }}
{{- end }}
{{- $n := regexFind "^[0-9]+" $d | int64 }}
{{- $unit := regexFind "[a-z]+$" $d }}
{{- $per := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 }}
{{- mul $n (get $per $unit) }}
{{- end }}

{{/*
The owners' file (tenants.existingSecret): its variable, its mount (the
Secret as a directory, never a subPath, which the kubelet would not update)
and its volume; nothing without it.
*/}}
{{- define "hermes.tenantsEnv" -}}
{{- with .Values.tenants.existingSecret }}
- {name: MOBILE_TENANTS_FILE, value: {{ printf "/etc/hermes/tenants/%s" $.Values.tenants.key | quote }}}
{{- end }}
{{- end }}

{{- define "hermes.tenantsMount" -}}
{{- with .Values.tenants.existingSecret }}
- {name: tenants, mountPath: /etc/hermes/tenants, readOnly: true}
{{- end }}
{{- end }}

{{- define "hermes.tenantsVolume" -}}
{{- with .Values.tenants.existingSecret }}
- name: tenants
  secret:
    secretName: {{ . }}
    items:
      - {key: {{ $.Values.tenants.key }}, path: {{ $.Values.tenants.key }}}
{{- end }}
{{- end }}
