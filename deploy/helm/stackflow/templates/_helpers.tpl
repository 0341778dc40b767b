{{/* Names: <release>-<chart> (or the overrides), then -<component>, within 63 characters. */}}
{{- define "stackflow.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "stackflow.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 42 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 42 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 42 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* (dict "ctx" $ "component" "worker-kubernetes") */}}
{{- define "stackflow.componentName" -}}
{{- printf "%s-%s" (include "stackflow.fullname" .ctx) .component -}}
{{- end -}}

{{- define "stackflow.selectorLabels" -}}
app.kubernetes.io/name: {{ include "stackflow.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "stackflow.labels" -}}
{{ include "stackflow.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: stackflow
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* (dict "ctx" $ "image" <the component's image override>): a component's own repository
     takes its own tag (else the global tag or the appVersion, never the global digest). */}}
{{- define "stackflow.image" -}}
{{- $g := .ctx.Values.image -}}
{{- if .image.repository -}}
{{- printf "%s:%s" .image.repository (.image.tag | default $g.tag | default .ctx.Chart.AppVersion) -}}
{{- else if .image.tag -}}
{{- printf "%s:%s" $g.repository .image.tag -}}
{{- else if $g.digest -}}
{{- printf "%s@%s" $g.repository $g.digest -}}
{{- else -}}
{{- printf "%s:%s" $g.repository ($g.tag | default .ctx.Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* Environment every component shares: Temporal, the state backend, the keys, the home. */}}
{{- define "stackflow.commonEnv" -}}
- name: TEMPORAL_ADDRESS
  value: {{ .Values.temporal.address | quote }}
- name: TEMPORAL_NAMESPACE
  value: {{ .Values.temporal.namespace | quote }}
- name: STACKFLOW_TASK_QUEUE
  value: {{ .Values.temporal.taskQueue | quote }}
- name: STACKFLOW_HOME
  value: /data/stackflow
- name: STACKFLOW_STATE_URL
  valueFrom:
    secretKeyRef:
      name: {{ required "secrets.stateUrl.name: the Secret holding STACKFLOW_STATE_URL" .Values.secrets.stateUrl.name }}
      key: {{ .Values.secrets.stateUrl.key }}
- name: STACKFLOW_ENCRYPTION_KEY_FILE
  value: /etc/stackflow/keys/keys.yaml
{{- if .Values.tracing.enabled }}
- name: STACKFLOW_TRACING
  value: otlp
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ required "tracing.endpoint: the OTLP/HTTP collector's URL (tracing.enabled is true)" .Values.tracing.endpoint | quote }}
{{- end }}
{{- end -}}

{{/* Volumes every pod has: the key file, STACKFLOW_HOME and /tmp (the root is read-only). */}}
{{- define "stackflow.commonVolumes" -}}
- name: keys
  secret:
    secretName: {{ required "secrets.encryptionKey.name: the Secret holding the key file" .Values.secrets.encryptionKey.name }}
    defaultMode: 0440
    items:
      - key: {{ .Values.secrets.encryptionKey.key }}
        path: keys.yaml
- name: home
  emptyDir:
    sizeLimit: {{ .Values.scratch.homeSizeLimit }}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.scratch.tmpSizeLimit }}
{{- end -}}

{{- define "stackflow.commonMounts" -}}
- name: keys
  mountPath: /etc/stackflow/keys
  readOnly: true
- name: home
  mountPath: /data/stackflow
- name: tmp
  mountPath: /tmp
{{- end -}}

{{/* envFrom of a component's envFromSecrets (names of existing Secrets). */}}
{{- define "stackflow.envFrom" -}}
{{- range . }}
- secretRef:
    name: {{ . }}
{{- end }}
{{- end -}}

{{/* Pod scheduling: the component's own settings, else the global ones.
     (dict "ctx" $ "c" <component values>) */}}
{{- define "stackflow.scheduling" -}}
{{- $v := .ctx.Values -}}
{{- with (.c.nodeSelector | default $v.nodeSelector) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (.c.tolerations | default $v.tolerations) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (.c.affinity | default $v.affinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (.c.topologySpreadConstraints | default $v.topologySpreadConstraints) }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $v.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* The workers this release runs, in order: main first. */}}
{{- define "stackflow.workerNames" -}}
main kubernetes terraform onprem
{{- end -}}

{{- define "stackflow.workerComponent" -}}
{{- if eq . "main" }}worker{{ else }}worker-{{ . }}{{ end -}}
{{- end -}}

{{/* The task queue a worker polls: the main queue, or <main>-<runtime>. */}}
{{- define "stackflow.workerQueue" -}}
{{- if eq .runtime "main" }}{{ .ctx.Values.temporal.taskQueue }}{{ else }}{{ printf "%s-%s" .ctx.Values.temporal.taskQueue .runtime }}{{ end -}}
{{- end -}}

{{/* The Temporal connection's TLS, mTLS and API key (temporal.tls, temporal.apiKey): env,
     volume and mount of the workers and the API (the codec server never calls Temporal). */}}
{{- define "stackflow.temporalTlsOn" -}}
{{- $t := .Values.temporal -}}
{{- if or $t.tls.enabled $t.tls.clientCert.secretName $t.tls.serverCA.secretName $t.apiKey.secretName }}on{{ end -}}
{{- end -}}

{{- define "stackflow.temporalEnv" -}}
{{- $t := .Values.temporal -}}
{{- if include "stackflow.temporalTlsOn" . }}
- name: TEMPORAL_TLS
  value: "true"
{{- end }}
{{- if $t.tls.clientCert.secretName }}
- name: TEMPORAL_TLS_CLIENT_CERT_PATH
  value: /etc/stackflow/temporal-tls/client.crt
- name: TEMPORAL_TLS_CLIENT_KEY_PATH
  value: /etc/stackflow/temporal-tls/client.key
{{- end }}
{{- if $t.tls.serverCA.secretName }}
- name: TEMPORAL_TLS_SERVER_CA_CERT_PATH
  value: /etc/stackflow/temporal-tls/ca.crt
{{- end }}
{{- with $t.tls.serverName }}
- name: TEMPORAL_TLS_SERVER_NAME
  value: {{ . | quote }}
{{- end }}
{{- if $t.apiKey.secretName }}
- name: TEMPORAL_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $t.apiKey.secretName }}
      key: {{ $t.apiKey.key }}
{{- end }}
{{- end -}}

{{- define "stackflow.temporalVolumes" -}}
{{- $tls := .Values.temporal.tls -}}
{{- if or $tls.clientCert.secretName $tls.serverCA.secretName }}
- name: temporal-tls
  projected:
    defaultMode: 0440
    sources:
      {{- with $tls.clientCert.secretName }}
      - secret:
          name: {{ . }}
          items:
            - {key: tls.crt, path: client.crt}
            - {key: tls.key, path: client.key}
      {{- end }}
      {{- with $tls.serverCA.secretName }}
      - secret:
          name: {{ . }}
          items:
            - {key: {{ $tls.serverCA.key }}, path: ca.crt}
      {{- end }}
{{- end }}
{{- end -}}

{{- define "stackflow.temporalMounts" -}}
{{- $tls := .Values.temporal.tls -}}
{{- if or $tls.clientCert.secretName $tls.serverCA.secretName }}
- name: temporal-tls
  mountPath: /etc/stackflow/temporal-tls
  readOnly: true
{{- end }}
{{- end -}}
