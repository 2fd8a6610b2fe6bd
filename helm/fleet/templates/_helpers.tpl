{{- define "fleet.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* Environment every service shares; $user is its NATS user. */}}
{{- define "fleet.env" -}}
{{- $root := index . 0 -}}
{{- $user := index . 1 -}}
- name: NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $root.Values.nats.passwordsSecret }}
      key: FLEET_NATS_{{ $user | upper | replace "-" "_" }}_PASSWORD
- name: FLEET__NATS__URL
  value: "nats://{{ $user }}:$(NATS_PASSWORD)@{{ $root.Values.nats.host }}:{{ $root.Values.nats.port }}"
- name: FLEET__NATS__PARTITIONS
  value: {{ $root.Values.nats.partitions | quote }}
- name: OTEL_SERVICE_NAME
  value: fleet-{{ $user }}
{{- range $k, $v := $root.Values.env }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{- end -}}
