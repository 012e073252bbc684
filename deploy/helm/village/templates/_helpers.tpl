{{/* The image of both containers. */}}
{{- define "village.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* Village's labels, on every object. */}}
{{- define "village.labels" -}}
app.kubernetes.io/name: village
{{- end -}}

{{/* Fails the render on a choice Village does not have. */}}
{{- define "village.validate" -}}
{{- if not (has .Values.backend (list "vxlan" "host-gw" "auto" "wireguard")) -}}
{{- fail (printf "backend %q: one of vxlan, host-gw, auto, wireguard" .Values.backend) -}}
{{- end -}}
{{- if .Values.lan.enabled -}}
{{- if not (has .Values.lan.addresses (list "pool" "dhcp")) -}}
{{- fail (printf "lan.addresses %q: one of pool, dhcp" .Values.lan.addresses) -}}
{{- end -}}
{{- if not (has .Values.lan.pods (list "annotated" "all")) -}}
{{- fail (printf "lan.pods %q: one of annotated, all" .Values.lan.pods) -}}
{{- end -}}
{{- if and .Values.lan.services.ranges (eq .Values.lan.addresses "dhcp") -}}
{{- fail "lan.services needs lan.addresses pool: with dhcp the LAN's DHCP server owns the addresses" -}}
{{- end -}}
{{- /* The ranges go into lan-services.yaml's admission policy (CEL) too:
  addresses, nothing else. */ -}}
{{- range .Values.lan.services.ranges -}}
{{- if and .rangeStart .rangeEnd (not (and (regexMatch "^[0-9A-Fa-f:.]+$" (toString .rangeStart)) (regexMatch "^[0-9A-Fa-f:.]+$" (toString .rangeEnd)))) -}}
{{- fail (printf "lan.services.ranges: %v-%v is not a range of IP addresses" .rangeStart .rangeEnd) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* lan.addresses dhcp: villaged is the LAN pods' DHCP client. */}}
{{- define "village.dhcp" -}}
{{- if and .Values.lan.enabled (eq .Values.lan.addresses "dhcp") -}}true{{- end -}}
{{- end -}}

{{/* lan.services.ranges: Services on the LAN, and their gossip key. */}}
{{- define "village.services" -}}
{{- if and .Values.lan.enabled .Values.lan.services.ranges -}}true{{- end -}}
{{- end -}}
