{{- define "fleet.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* Environment every service shares; $user is its NATS user. */}}
{{- define "fleet.env" -}}
{{- $root := index . 0 -}}
{{- $user := index . 1 -}}
- name: FLEET__NATS__URL
  value: "{{ if $root.Values.nats.tls.enabled }}tls{{ else }}nats{{ end }}://{{ $root.Values.nats.host }}:{{ $root.Values.nats.port }}"
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
- name: OTEL_SERVICE_NAME
  value: fleet-{{ $user }}
{{- range $k, $v := $root.Values.env }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{- end -}}
