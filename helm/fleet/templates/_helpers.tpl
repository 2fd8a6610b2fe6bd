{{- define "fleet.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* The release's prefix for every object: two releases share a namespace. */}}
{{- define "fleet.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{ .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else -}}
{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" }}
{{- end -}}
{{- end -}}

{{/* Selector labels of a component: (list $ "hub"). */}}
{{- define "fleet.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ $root.Chart.Name }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* Every label of a component: (list $ "hub"). */}}
{{- define "fleet.labels" -}}
{{- $root := index . 0 -}}
{{ include "fleet.selector" . }}
app.kubernetes.io/part-of: fleet
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
helm.sh/chart: {{ $root.Chart.Name }}-{{ $root.Chart.Version }}
{{- end -}}

{{/* Pod annotations: Prometheus scraping of the ops port. */}}
{{- define "fleet.scrape" -}}
{{- $root := index . 0 -}}
{{- if $root.Values.metrics.scrapeAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ index . 1 | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}

{{/* The pod's security context: non-root, the default seccomp profile. */}}
{{- define "fleet.podSecurity" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile: { type: RuntimeDefault }
{{- end -}}

{{/* The container's: read-only root filesystem, no privilege, no capability. */}}
{{- define "fleet.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: { drop: ["ALL"] }
{{- end -}}

{{/* Environment every service shares; $user is its NATS user. */}}
{{- define "fleet.env" -}}
{{- $root := index . 0 -}}
{{- $user := index . 1 -}}
- name: FLEET__NATS__URL
  value: "{{ if $root.Values.nats.tls.enabled }}tls{{ else }}nats{{ end }}://{{ if $root.Values.nats.deploy }}{{ include "fleet.fullname" $root }}-nats{{ else }}{{ $root.Values.nats.host }}{{ end }}:{{ $root.Values.nats.port }}"
- name: FLEET__NATS__USER
  value: {{ $user | quote }}
- name: FLEET__NATS__PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $root.Values.nats.passwordsSecret }}
      key: FLEET_NATS_{{ $user | upper | replace "-" "_" }}_PASSWORD
{{- if $root.Values.nats.tls.enabled }}
- name: FLEET__NATS__TLS__REQUIRED
  value: "true"
- name: FLEET__NATS__TLS__CA_FILE
  value: /etc/fleet/nats-tls/ca.crt
{{- end }}
- name: FLEET__NATS__PARTITIONS
  value: {{ $root.Values.nats.partitions | quote }}
- name: FLEET__NATS__NUM_REPLICAS
  value: {{ $root.Values.nats.numReplicas | quote }}
- name: OTEL_SERVICE_NAME
  value: fleet-{{ $user }}
{{- range $k, $v := $root.Values.env }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{- end -}}

{{/* A service's own configuration: plain values and values from Secrets. */}}
{{- define "fleet.ownEnv" -}}
{{- $svc := . -}}
{{- range $k, $v := $svc.env }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{- range $k, $ref := $svc.secretEnv }}
- name: {{ $k }}
  valueFrom: { secretKeyRef: { name: {{ $ref.secret }}, key: {{ $ref.key }} } }
{{- end }}
{{- end -}}

{{/* The NATS CA volume and its mount, when TLS is on. */}}
{{- define "fleet.tlsMount" -}}
{{- if .Values.nats.tls.enabled }}
volumeMounts:
  - { name: nats-tls, mountPath: /etc/fleet/nats-tls, readOnly: true }
{{- end }}
{{- end -}}
{{- define "fleet.tlsVolume" -}}
{{- if .Values.nats.tls.enabled }}
volumes:
  - name: nats-tls
    secret: { secretName: {{ .Values.nats.tls.caSecret }} }
{{- end }}
{{- end -}}
