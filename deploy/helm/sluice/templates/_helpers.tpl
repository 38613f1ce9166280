{{/* Names and labels shared by the chart's templates. */}}

{{- define "sluice.name" -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "sluice.labels" -}}
app.kubernetes.io/part-of: sluice
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: include "sluice.selector" (list . "gateway") */}}
{{- define "sluice.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: sluice
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "sluice.image" -}}
{{- $root := index . 0 -}}
{{- $tag := $root.Values.image.tag | default $root.Chart.AppVersion -}}
{{- if $root.Values.image.registry -}}
{{ printf "%s/%s:%s" $root.Values.image.registry (index . 1) $tag }}
{{- else -}}
{{ printf "%s:%s" (index . 1) $tag }}
{{- end -}}
{{- end -}}

{{- define "sluice.gatewaySecret" -}}
{{- .Values.secrets.gateway | default (printf "%s-gateway" (include "sluice.name" .)) -}}
{{- end -}}

{{- define "sluice.natsTlsSecret" -}}
{{- .Values.secrets.natsTls | default (printf "%s-nats-tls" (include "sluice.name" .)) -}}
{{- end -}}

{{/* The NATS servers' client URLs, one per server (clients try each). */}}
{{- define "sluice.natsUrls" -}}
{{- if not .Values.nats.enabled -}}
{{- required "nats.externalUrls: the NATS servers' URLs when nats.enabled is false" .Values.nats.externalUrls -}}
{{- else -}}
{{- $name := include "sluice.name" . -}}
{{- $urls := list -}}
{{- range $i := until (int .Values.nats.replicas) -}}
{{- $urls = append $urls (printf "tls://%s-nats-%d.%s-nats-headless.%s.svc:4222" $name $i $name $.Release.Namespace) -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}
{{- end -}}

{{/* OTLP export settings (standard OTEL_* variables), when an endpoint is set. */}}
{{- define "sluice.otelEnv" -}}
{{- $root := index . 0 -}}
{{- if $root.Values.otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ $root.Values.otel.endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ $root.Values.otel.protocol | quote }}
- name: OTEL_SERVICE_NAME
  value: {{ index . 1 | quote }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ trimPrefix "," (printf "%s,k8s.namespace.name=%s" $root.Values.otel.resourceAttributes $root.Release.Namespace) | quote }}
{{- end }}
{{- end -}}

{{/* The security context every container but a DPDK host's runs with. */}}
{{- define "sluice.restricted" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The gateway's configuration file. */}}
{{- define "sluice.gatewayToml" -}}
# Rendered by the chart; see gateway/src/config.rs for every key.
listen = "0.0.0.0:8080"
data-dir = "/var/lib/sluice"
cluster = {{ .Values.cluster | quote }}
nats = {{ include "sluice.natsUrls" . | quote }}
nats-nkey = "/etc/sluice/secrets/gateway.nk"
nats-ca = "/etc/sluice/secrets/ca.pem"
nats-cert = "/etc/sluice/secrets/gateway.pem"
nats-key = "/etc/sluice/secrets/gateway-key.pem"
metrics-listen = "0.0.0.0:9464"
default-groups = [{{ range $i, $g := .Values.gateway.defaultGroups }}{{ if $i }}, {{ end }}{{ $g | quote }}{{ end }}]
{{- with .Values.gateway.extraConfig }}
{{- . | nindent 0 }}
{{- end }}
{{- range .Values.hosts.groups }}
{{- if .ports }}

[groups.{{ .name }}]
ports = [{{ range $i, $p := .ports }}{{ if $i }}, {{ end }}{{ $p | int }}{{ end }}]
{{- end }}
{{- end }}
{{- end -}}
