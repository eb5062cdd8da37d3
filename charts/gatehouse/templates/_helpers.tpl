{{/*
The selector label, the same as config/default's: the kustomize and Helm installations select
their Pods alike.
*/}}
{{- define "gatehouse.selectorLabels" -}}
app.kubernetes.io/name: gatehouse
{{- end }}

{{/* Every object's labels: the selector label plus Helm's bookkeeping. */}}
{{- define "gatehouse.labels" -}}
{{ include "gatehouse.selectorLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The CNI DaemonSet's labels (its own name, so the Service never selects its Pods). */}}
{{- define "gatehouse.cniLabels" -}}
app.kubernetes.io/name: gatehouse-cni
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "gatehouse.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}
