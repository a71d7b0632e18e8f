{{/* Labels every object of the hub side carries. */}}
{{- define "argocd-pull.labels" -}}
app.kubernetes.io/name: argocd-pull-hub-controller
app.kubernetes.io/part-of: argocd-pull
{{- end }}

{{- define "argocd-pull.hubImage" -}}
{{ .Values.hubController.image.repository }}:{{ .Values.hubController.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "argocd-pull.agentImage" -}}
{{ .Values.agent.image.repository }}:{{ .Values.agent.image.tag | default .Chart.AppVersion }}
{{- end }}
