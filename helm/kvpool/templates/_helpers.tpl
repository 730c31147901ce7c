{{/*
Names. The full name is kept to 40 characters so that every derived name ("-etcd-headless",
StatefulSet pod names, the controller-revision-hash label) stays within Kubernetes' limits.
*/}}
{{- define "kvpool.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvpool.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kvpool.master.fullname" -}}{{ include "kvpool.fullname" . }}-master{{- end -}}
{{- define "kvpool.node.fullname" -}}{{ include "kvpool.fullname" . }}-node{{- end -}}
{{- define "kvpool.etcd.fullname" -}}{{ include "kvpool.fullname" . }}-etcd{{- end -}}
{{- define "kvpool.etcd.headless" -}}{{ include "kvpool.fullname" . }}-etcd-headless{{- end -}}

{{- define "kvpool.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels shared by every resource. */}}
{{- define "kvpool.labels" -}}
helm.sh/chart: {{ include "kvpool.chart" . }}
app.kubernetes.io/name: {{ include "kvpool.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kvpool
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: call with (dict "ctx" $ "component" "master"). */}}
{{- define "kvpool.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvpool.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "kvpool.componentLabels" -}}
{{ include "kvpool.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "kvpool.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kvpool.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kvpool.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Pod-level security context: non-root, RuntimeDefault seccomp. */}}
{{- define "kvpool.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.runAsUser }}
runAsGroup: {{ .Values.securityContext.runAsGroup }}
fsGroup: {{ .Values.securityContext.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Container-level security context: read-only root, no escalation, no capabilities. */}}
{{- define "kvpool.containerSecurityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop:
    - ALL
{{- end -}}

{{/* Where clients and storage nodes reach the master: <service>.<namespace>.svc:<port>. */}}
{{- define "kvpool.masterAddress" -}}
{{- printf "%s.%s.svc:%d" (include "kvpool.master.fullname" .) .Release.Namespace (int .Values.master.grpcPort) -}}
{{- end -}}

{{/*
Where storage nodes find the master: with several masters, through etcd (etcd://HOST:PORT,.../CLUSTER),
so they follow a failover at once instead of waiting for the Service to notice it; else the Service.
*/}}
{{- define "kvpool.nodeMasterAddress" -}}
{{- if include "kvpool.ha" . -}}
{{- $endpoints := list -}}
{{- range (splitList "," (include "kvpool.etcd.endpoints" .)) -}}
{{- $endpoints = append $endpoints (. | trimPrefix "http://" | trimPrefix "https://" | trimSuffix "/") -}}
{{- end -}}
{{- printf "etcd://%s/%s" (join "," $endpoints) (include "kvpool.clusterName" .) -}}
{{- else -}}
{{- include "kvpool.masterAddress" . -}}
{{- end -}}
{{- end -}}

{{/* True ("true") when masters elect a leader through etcd, i.e. more than one replica. */}}
{{- define "kvpool.ha" -}}
{{- if gt (int .Values.master.replicas) 1 -}}true{{- end -}}
{{- end -}}

{{- define "kvpool.etcd.bundled" -}}
{{- if and (include "kvpool.ha" .) (eq .Values.etcd.mode "bundled") -}}true{{- end -}}
{{- end -}}

{{/* The etcd client URLs the masters use, comma separated. */}}
{{- define "kvpool.etcd.endpoints" -}}
{{- if eq .Values.etcd.mode "bundled" -}}
{{- $urls := list -}}
{{- $name := include "kvpool.etcd.fullname" . -}}
{{- $headless := include "kvpool.etcd.headless" . -}}
{{- range $i := until (int .Values.etcd.bundled.replicas) -}}
{{- $urls = append $urls (printf "http://%s-%d.%s.%s.svc:2379" $name $i $headless $.Release.Namespace) -}}
{{- end -}}
{{- join "," $urls -}}
{{- else -}}
{{- if not .Values.etcd.external.endpoints -}}
{{- fail (printf "master.replicas is %d, so the masters elect a leader through etcd, and etcd.mode is \"external\" but etcd.external.endpoints is empty: list your etcd client URLs (e.g. [\"http://etcd-0.etcd:2379\"]) or set etcd.mode to \"bundled\"" (int .Values.master.replicas)) -}}
{{- end -}}
{{- join "," .Values.etcd.external.endpoints -}}
{{- end -}}
{{- end -}}

{{- define "kvpool.clusterName" -}}
{{- default (include "kvpool.fullname" .) .Values.master.clusterName -}}
{{- end -}}

{{/*
Sizes. "kvpool.bytes" turns a size string ("4Gi", "1.5Ti", "4096") into a number of bytes,
printed as an integer; "kvpool.quantity" prints a byte count as a Kubernetes quantity in the
largest binary unit that divides it exactly. The schema already checks the form of every
size; the check here guards the template against being called with anything else.
*/}}
{{- define "kvpool.bytes" -}}
{{- $text := toString .value -}}
{{- if not (regexMatch `^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti)?$` $text) -}}
{{- fail (printf "%s: cannot read %q as a size: use a positive number with an optional Ki, Mi, Gi or Ti suffix, e.g. 4Gi" .key $text) -}}
{{- end -}}
{{- $number := regexFind `^[0-9]+(\.[0-9]+)?` $text -}}
{{- $unit := trimPrefix $number $text -}}
{{- $scale := get (dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776) $unit -}}
{{- mulf (float64 $number) $scale | floor | int64 -}}
{{- end -}}

{{- define "kvpool.quantity" -}}
{{- $n := int64 . -}}
{{- $gi := 1073741824 -}}
{{- $mi := 1048576 -}}
{{- if and (gt $n 0) (eq (mod $n $gi) 0) -}}{{ div $n $gi }}Gi
{{- else if and (gt $n 0) (eq (mod $n $mi) 0) -}}{{ div $n $mi }}Mi
{{- else if and (gt $n 0) (eq (mod $n 1024) 0) -}}{{ div $n 1024 }}Ki
{{- else -}}{{ $n }}
{{- end -}}
{{- end -}}

{{/*
Storage node memory: the segment plus the overhead, unless the user set a request or limit, in
which case it must cover that much. Returns a dict as JSON: {"request": "...", "limit": "..."}.
*/}}
{{- define "kvpool.node.memory" -}}
{{- $m := .Values.storage.memory -}}
{{- $dram := include "kvpool.bytes" (dict "key" "storage.dram" "value" .Values.storage.dram) | int64 -}}
{{- $overhead := include "kvpool.bytes" (dict "key" "storage.memory.overhead" "value" $m.overhead) | int64 -}}
{{- $needed := add $dram $overhead -}}
{{- $request := $needed -}}
{{- $limit := $needed -}}
{{- if $m.limit -}}
{{- $limit = include "kvpool.bytes" (dict "key" "storage.memory.limit" "value" $m.limit) | int64 -}}
{{- if lt $limit $needed -}}
{{- fail (printf "storage.memory.limit (%s) is below the DRAM segment storage.dram (%s) plus storage.memory.overhead (%s) = %s: the storage node would be OOM-killed once its segment fills. Raise storage.memory.limit to at least %s (or leave it empty), or lower storage.dram." $m.limit .Values.storage.dram $m.overhead (include "kvpool.quantity" $needed) (include "kvpool.quantity" $needed)) -}}
{{- end -}}
{{- end -}}
{{- if $m.request -}}
{{- $request = include "kvpool.bytes" (dict "key" "storage.memory.request" "value" $m.request) | int64 -}}
{{- if lt $request $needed -}}
{{- fail (printf "storage.memory.request (%s) is below the DRAM segment storage.dram (%s) plus storage.memory.overhead (%s) = %s: the segment is prefaulted and resident, so the pod must request it. Raise storage.memory.request to at least %s (or leave it empty), or lower storage.dram." $m.request .Values.storage.dram $m.overhead (include "kvpool.quantity" $needed) (include "kvpool.quantity" $needed)) -}}
{{- end -}}
{{- else if $m.limit -}}
{{- $request = $limit -}}
{{- end -}}
{{- if gt $request $limit -}}
{{- fail (printf "storage.memory.request (%s) is above storage.memory.limit (%s): Kubernetes rejects a request larger than its limit." (include "kvpool.quantity" $request) (include "kvpool.quantity" $limit)) -}}
{{- end -}}
{{- dict "request" (include "kvpool.quantity" $request) "limit" (include "kvpool.quantity" $limit) | toJson -}}
{{- end -}}

{{/* The NVMe claim size: storage.nvme.pvc.size, or storage.nvme.size when empty. */}}
{{- define "kvpool.nvme.claimSize" -}}
{{- $nvme := .Values.storage.nvme -}}
{{- if $nvme.pvc.size -}}
{{- $claim := include "kvpool.bytes" (dict "key" "storage.nvme.pvc.size" "value" $nvme.pvc.size) | int64 -}}
{{- $segment := include "kvpool.bytes" (dict "key" "storage.nvme.size" "value" $nvme.size) | int64 -}}
{{- if lt $claim $segment -}}
{{- fail (printf "storage.nvme.pvc.size (%s) is smaller than the NVMe segment storage.nvme.size (%s): the segment file would not fit on the claim. Raise storage.nvme.pvc.size or leave it empty to use storage.nvme.size." $nvme.pvc.size $nvme.size) -}}
{{- end -}}
{{- $nvme.pvc.size -}}
{{- else -}}
{{- $nvme.size -}}
{{- end -}}
{{- end -}}

{{/* Preferred anti-affinity: spread one component's pods over hosts. */}}
{{- define "kvpool.spreadAffinity" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "kvpool.selectorLabels" . | nindent 12 }}
{{- end -}}

{{/* Container resources from {requests: {cpu, memory}, limits: {cpu, memory}}, empty values left out. */}}
{{- define "kvpool.resources" -}}
{{- $out := dict -}}
{{- $resources := . -}}
{{- range $section := list "requests" "limits" -}}
{{- $values := dict -}}
{{- range $key, $value := (get $resources $section | default dict) -}}
{{- if $value -}}
{{- $_ := set $values $key $value -}}
{{- end -}}
{{- end -}}
{{- if $values -}}
{{- $_ := set $out $section $values -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* An int-or-percent value (PodDisruptionBudget.maxUnavailable). */}}
{{- define "kvpool.intOrPercent" -}}
{{- if kindIs "string" . -}}{{ . | quote }}{{- else -}}{{ int . }}{{- end -}}
{{- end -}}

{{/* The spec of the NVMe PersistentVolumeClaim of a storage node. */}}
{{- define "kvpool.nvme.claimSpec" -}}
accessModes:
  - {{ .Values.storage.nvme.pvc.accessMode }}
{{- with .Values.storage.nvme.pvc.storageClassName }}
storageClassName: {{ . }}
{{- end }}
resources:
  requests:
    storage: {{ include "kvpool.nvme.claimSize" . }}
{{- end -}}
