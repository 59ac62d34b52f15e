{{/* The chart name, shortened to what a label allows. */}}
{{- define "hermes.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The prefix of every resource name: <release>-<chart>, or the override. */}}
{{- define "hermes.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
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

{{/* The image, tag defaulting to the chart's appVersion. */}}
{{- define "hermes.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
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

{{/* NATS_URL. */}}
{{- define "hermes.natsURL" -}}
{{- if .Values.nats.bundled }}
{{- printf "nats://%s-nats:4222" (include "hermes.fullname" .) }}
{{- else }}
{{- required "set nats.url (or nats.bundled=true)" .Values.nats.url }}
{{- end }}
{{- end }}

{{/*
A secret environment variable: from the chart's Secret or the user's, under
the key named in auth.existingSecretKeys. Optional, so a key the user's
Secret lacks leaves the variable unset.
Call with (list $ "MOBILE_TOKEN" "token").
*/}}
{{- define "hermes.secretEnv" -}}
{{- $ := index . 0 }}
{{- $key := index $.Values.auth.existingSecretKeys (index . 2) }}
{{- if not $.Values.auth.existingSecret }}{{ $key = index . 1 }}{{ end -}}
- name: {{ index . 1 }}
  valueFrom:
    secretKeyRef:
      name: {{ include "hermes.secretName" $ }}
      key: {{ $key }}
      optional: true
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
