{{/*
Shared names. The objects mirror config/ one to one (tests/unit/test_chart.py compares them), so
labels are the same literal ones config/ uses and no Helm-only label is added.
*/}}

{{- define "sidecarctl.namespace" -}}
{{- required "installation.namespace must be set" .Values.installation.namespace -}}
{{- end -}}

{{/* true when the manager keeps its own CA (--self-signed), false with cert-manager; fails on anything else. */}}
{{- define "sidecarctl.selfSigned" -}}
{{- $mode := .Values.certificates.mode -}}
{{- if eq $mode "self-signed" -}}true
{{- else if eq $mode "cert-manager" -}}false
{{- else -}}{{- fail (printf "certificates.mode must be self-signed or cert-manager, not %q" $mode) -}}
{{- end -}}
{{- end -}}

{{- define "sidecarctl.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "sidecarctl.managerLabels" -}}
app.kubernetes.io/name: sidecarctl
app.kubernetes.io/component: manager
{{- end -}}

{{/* The namespaces whose pods never reach the injection webhook: the system ones and the manager's. */}}
{{- define "sidecarctl.excludedNamespaces" -}}
{{- list "kube-node-lease" "kube-public" "kube-system" (include "sidecarctl.namespace" .) | sortAlpha | toJson -}}
{{- end -}}
