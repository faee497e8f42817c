{{- define "tether.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "tether.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The image by digest when image.digest is set (the tag is then ignored), else by tag. */}}
{{- define "tether.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* The controller's exact RBAC, generated from config/rbac into files/rbac.yaml, placed in the release namespace; its ServiceAccount carries serviceAccount.annotations and .labels. */}}
{{- define "tether.rbac" -}}
{{ .Files.Get "files/rbac.yaml" | replace "namespace: tether-system" (printf "namespace: %s" .Release.Namespace) | replace "kind: ServiceAccount\nmetadata:\n" (printf "kind: ServiceAccount\nmetadata:%s\n" (include "tether.serviceAccountMeta" .)) }}
{{- end }}

{{/* The pods' and containers' securityContext (values podSecurityContext and securityContext), for the Deployment and the hook Jobs alike. */}}
{{- define "tether.podSecurity" -}}
{{ toYaml .Values.podSecurityContext }}
{{- end }}

{{- define "tether.containerSecurity" -}}
{{ toYaml .Values.securityContext }}
{{- end }}

{{/* The ServiceAccount in files/rbac.yaml, with serviceAccount.annotations and .labels added. */}}
{{- define "tether.serviceAccountMeta" -}}
{{- $meta := dict -}}
{{- with .Values.serviceAccount.annotations }}{{ $_ := set $meta "annotations" . }}{{ end -}}
{{- with .Values.serviceAccount.labels }}{{ $_ := set $meta "labels" . }}{{ end -}}
{{- if $meta }}
{{ toYaml $meta | indent 2 }}
{{- end }}
{{- end }}
