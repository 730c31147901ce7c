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
{{- define "kvpool.master.metrics" -}}{{ include "kvpool.fullname" . }}-master-metrics{{- end -}}
{{/* The Service carrying the master's HTTP port: the master Service if ClusterIP, else its own. */}}
{{- define "kvpool.master.httpService" -}}
{{- if eq .Values.master.service.type "ClusterIP" -}}{{ include "kvpool.master.fullname" . }}{{- else -}}{{ include "kvpool.master.metrics" . }}{{- end -}}
{{- end -}}
{{- define "kvpool.master.headless" -}}{{ include "kvpool.fullname" . }}-master-headless{{- end -}}
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
With several masters, the domain of the headless Service that gives each master pod (a
StatefulSet pod) a DNS name of its own, <pod>.<this domain>: what a master advertises as the
leader's address, and what the master's certificate names (as *.<this domain>).
*/}}
{{- define "kvpool.master.podDomain" -}}
{{- printf "%s.%s.svc" (include "kvpool.master.headless" .) .Release.Namespace -}}
{{- end -}}

{{/*
Where storage nodes find the master: with several masters and auth.insecure, through etcd
(etcd://HOST:PORT,.../CLUSTER), so they follow a failover at once instead of waiting for the
Service to notice it; else the Service. A secure cluster's etcd requires client certificates,
which only the masters hold: its nodes go through the Service, whose name the master's
certificate carries. The Service routes to every master, leader and standbys (all of them are
ready): a standby names the leader, <pod>.<master.podDomain>, which the certificate names too.
*/}}
{{- define "kvpool.nodeMasterAddress" -}}
{{- if and (include "kvpool.ha" .) (not (include "kvpool.secure" .)) -}}
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
{{- $urls = append $urls (printf "%s://%s-%d.%s.%s.svc:2379" (include "kvpool.etcd.scheme" $) $name $i $headless $.Release.Namespace) -}}
{{- end -}}
{{- join "," $urls -}}
{{- else -}}
{{- if not .Values.etcd.external.endpoints -}}
{{- fail (printf "master.replicas is %d, so the masters elect a leader through etcd, and etcd.mode is \"external\" but etcd.external.endpoints is empty: list your etcd client URLs (e.g. [\"%s://etcd-0.etcd:2379\"]) or set etcd.mode to \"bundled\"" (int .Values.master.replicas) (include "kvpool.etcd.scheme" .)) -}}
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
Re-replication and drains. "kvpool.rereplicationRate": master.rereplicationRate in bytes per
second (0: off). "kvpool.node.drainTimeout": storage.drain.timeout, or when 0 the time to copy
a whole node (its DRAM and NVMe segments) at that rate, plus a minute. "kvpool.node.grace":
the pod's terminationGracePeriodSeconds: with drain.onTermination, enough for the drain, the
readers' leases and the exit.
*/}}
{{- define "kvpool.rereplicationRate" -}}
{{- $rate := toString .Values.master.rereplicationRate -}}
{{- if eq $rate "0" -}}0{{- else -}}
{{- include "kvpool.bytes" (dict "key" "master.rereplicationRate" "value" $rate) -}}
{{- end -}}
{{- end -}}

{{- define "kvpool.node.drainTimeout" -}}
{{- $s := .Values.storage -}}
{{- if $s.drain.timeout -}}{{ int $s.drain.timeout }}{{- else -}}
{{- $rate := include "kvpool.rereplicationRate" . | int64 -}}
{{- if not $rate -}}
{{- fail "storage.drain.onTermination needs master.rereplicationRate above 0: a drain copies objects at that rate" -}}
{{- end -}}
{{- $bytes := include "kvpool.bytes" (dict "key" "storage.dram" "value" $s.dram) | int64 -}}
{{- if $s.nvme.enabled -}}
{{- $bytes = add $bytes (include "kvpool.bytes" (dict "key" "storage.nvme.size" "value" $s.nvme.size) | int64) -}}
{{- end -}}
{{- add (div (add $bytes (sub $rate 1)) $rate) 60 -}}
{{- end -}}
{{- end -}}

{{- define "kvpool.node.grace" -}}
{{- $s := .Values.storage -}}
{{- $grace := int $s.terminationGracePeriodSeconds -}}
{{- if $s.drain.onTermination -}}
{{- $needed := add (include "kvpool.node.drainTimeout" . | int) (ceil .Values.master.leaseTtl | int) 30 -}}
{{- $grace = max $grace $needed -}}
{{- end -}}
{{- $grace -}}
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


{{/* ------------------------------------------------------------------------- security */}}

{{/* True ("true") unless auth.insecure: TLS, tokens, etcd over TLS. */}}
{{- define "kvpool.secure" -}}
{{- if not .Values.auth.insecure -}}true{{- end -}}
{{- end -}}

{{- define "kvpool.etcd.scheme" -}}
{{- if include "kvpool.secure" . -}}https{{- else -}}http{{- end -}}
{{- end -}}

{{/*
Where the processes find their secrets. Secret volumes are mounted whole (never with subPath:
a subPath mount is a copy made at container start that never sees a Secret update, while a
whole volume is updated in place by the kubelet), so renewed certificates and a new
credentials.json reach the running masters, which re-read them; nodes read a renewed CA or
client certificate at their next connection, and their token only when they start.
*/}}
{{- define "kvpool.paths.tls" -}}/etc/kvpool/tls{{- end -}}
{{- define "kvpool.paths.clientTls" -}}/etc/kvpool/client-tls{{- end -}}
{{- define "kvpool.paths.credentials" -}}/etc/kvpool/credentials{{- end -}}
{{- define "kvpool.paths.nodeTokens" -}}/etc/kvpool/node-tokens{{- end -}}
{{- define "kvpool.paths.etcdTls" -}}/etc/kvpool/etcd-tls{{- end -}}
{{- define "kvpool.paths.capabilityKeys" -}}/etc/kvpool/capability-keys{{- end -}}
{{- define "kvpool.paths.quotas" -}}/etc/kvpool/quotas{{- end -}}

{{/* The Secret with the master's certificate (tls.crt, tls.key) and the CA (ca.crt). */}}
{{- define "kvpool.tls.secretName" -}}
{{- if .Values.tls.certManager.enabled -}}
{{- include "kvpool.fullname" . }}-tls
{{- else -}}
{{- .Values.tls.existingSecret -}}
{{- end -}}
{{- end -}}

{{/* The Secret whose certificate the storage nodes present to the master, or "". */}}
{{- define "kvpool.tls.nodeClientSecret" -}}
{{- if .Values.tls.nodeClientSecret -}}
{{- .Values.tls.nodeClientSecret -}}
{{- else if and .Values.tls.certManager.enabled .Values.tls.requireClientCert -}}
{{- include "kvpool.fullname" . }}-node-client-tls
{{- end -}}
{{- end -}}

{{/* The bundled etcd members' certificate (server and peer). */}}
{{- define "kvpool.etcd.tls.secretName" -}}
{{- if .Values.etcd.tls.certManager.enabled -}}
{{- include "kvpool.fullname" . }}-etcd-tls
{{- else -}}
{{- .Values.etcd.tls.existingSecret -}}
{{- end -}}
{{- end -}}

{{/* The certificate the masters present to etcd. */}}
{{- define "kvpool.etcd.tls.clientSecretName" -}}
{{- if .Values.etcd.tls.certManager.enabled -}}
{{- include "kvpool.fullname" . }}-etcd-client-tls
{{- else -}}
{{- default .Values.etcd.tls.existingSecret .Values.etcd.tls.clientExistingSecret -}}
{{- end -}}
{{- end -}}

{{/* The cert-manager issuer of the etcd certificates (as YAML). */}}
{{- define "kvpool.etcd.issuerRef" -}}
{{- $ref := .Values.etcd.tls.certManager.issuerRef -}}
{{- if not $ref.name -}}
{{- $ref = .Values.tls.certManager.issuerRef -}}
{{- end -}}
name: {{ $ref.name }}
kind: {{ $ref.kind }}
group: {{ $ref.group }}
{{- end -}}

{{/*
The environment variable holding a storage node's id: a StatefulSet pod's name is stable
(<fullname>-node-0, ...), a DaemonSet pod's is not (a random suffix, new with every pod), but
its Kubernetes node is, and a DaemonSet runs one storage node per Kubernetes node.
*/}}
{{- define "kvpool.node.idVar" -}}
{{- if eq .Values.storage.kind "StatefulSet" -}}POD_NAME{{- else -}}K8S_NODE_NAME{{- end -}}
{{- end -}}

{{/*
This release's directory inside a host directory the storage nodes share with other releases
(storage.warmRestart.hostPath, storage.nvme.hostPath with perRelease): <namespace>_<fullname>,
unique per release on a cluster (Helm refuses a second release whose objects, named after the
fullname, a release of the namespace already owns), and a relative path of DNS labels.
*/}}
{{- define "kvpool.node.releaseDir" -}}
{{- printf "%s_%s" .Release.Namespace (include "kvpool.fullname" .) -}}
{{- end -}}

{{/* The UCX TCP port range as a dict {"start": N, "end": M}, or an empty dict. */}}
{{- define "kvpool.ucxPortRange" -}}
{{- $range := .Values.storage.ucxTcpPortRange -}}
{{- if $range -}}
{{- $parts := splitList "-" $range -}}
{{- $start := index $parts 0 | int -}}
{{- $end := index $parts 1 | int -}}
{{- if or (lt $start 1024) (gt $end 65535) (gt $start $end) -}}
{{- fail (printf "storage.ucxTcpPortRange %q is not a range of ports: give START-END with 1024 <= START <= END <= 65535, e.g. 40000-40999" $range) -}}
{{- end -}}
{{- dict "start" $start "end" $end | toJson -}}
{{- else -}}
{{- dict | toJson -}}
{{- end -}}
{{- end -}}

{{/*
Refuses configurations that would run an unprotected cluster without having been asked to, or
that miss what the secure one needs. Included by the master Deployment (always rendered).
*/}}
{{- define "kvpool.validateSecurity" -}}
{{- $tls := .Values.tls -}}
{{- $auth := .Values.auth -}}
{{- if $auth.insecure -}}
{{- if and (ne .Values.master.service.type "ClusterIP") (not $auth.allowInsecureExposure) -}}
{{- fail (printf "auth.insecure is true and master.service.type is %s: the master would be reachable from outside the cluster in plaintext and without authentication. Use master.service.type=ClusterIP, or turn auth.insecure off (TLS and credentials), or, if you really mean it, set auth.allowInsecureExposure=true." .Values.master.service.type) -}}
{{- end -}}
{{- if and (include "kvpool.ha" .) (eq .Values.etcd.mode "external") -}}
{{- range .Values.etcd.external.endpoints -}}
{{- if hasPrefix "https://" . -}}
{{- fail (printf "etcd.external.endpoints lists %s, an https:// URL, but auth.insecure is true: an insecure master and its storage nodes reach etcd in plaintext, without a CA or a client certificate (the master would refuse to start: no --etcd-ca). Use the http:// URLs of an etcd that serves plaintext, or turn auth.insecure off (the masters then reach etcd over TLS with etcd.tls)." .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- if not $tls.enabled -}}
{{- fail "tls.enabled is false but auth.insecure is not set: kvpool runs without TLS only as an insecure cluster (no TLS, no authentication). Keep tls.enabled=true with tls.existingSecret or tls.certManager.enabled=true, or set auth.insecure=true (development only)." -}}
{{- end -}}
{{- if $tls.certManager.enabled -}}
{{- if not $tls.certManager.issuerRef.name -}}
{{- fail "tls.certManager.enabled is true but tls.certManager.issuerRef.name is empty: name the cert-manager Issuer (or ClusterIssuer, with tls.certManager.issuerRef.kind) that signs the master's certificate." -}}
{{- end -}}
{{- else if not $tls.existingSecret -}}
{{- fail "tls.existingSecret is empty: name a kubernetes.io/tls Secret holding tls.crt, tls.key and ca.crt (see docs/kubernetes.md, Security), or set tls.certManager.enabled=true with tls.certManager.issuerRef, or set auth.insecure=true (no TLS, no authentication; development only)." -}}
{{- end -}}
{{- if and $tls.requireClientCert (not (include "kvpool.tls.nodeClientSecret" .)) -}}
{{- fail "tls.requireClientCert is true but the storage nodes have no client certificate: set tls.nodeClientSecret to a kubernetes.io/tls Secret signed by the CA in ca.crt, or use tls.certManager.enabled=true, which issues one." -}}
{{- end -}}
{{- if not $auth.credentialsSecret -}}
{{- fail "auth.credentialsSecret is empty: the master admits only callers holding a token. Create the tokens with `kvpool token create --credentials credentials.json ...`, store the file in a Secret (kubectl create secret generic kvpool-credentials --from-file=credentials.json) and set auth.credentialsSecret to its name, or set auth.insecure=true (no TLS, no authentication; development only)." -}}
{{- end -}}
{{- if not $auth.nodeTokens.existingSecret -}}
{{- fail "auth.nodeTokens.existingSecret is empty: every storage node needs a node token. Create one per node id with `kvpool token create --credentials credentials.json --role node --node-id ID ...`, store them in a Secret keyed by node id and set auth.nodeTokens.existingSecret to its name, or set auth.insecure=true (no TLS, no authentication; development only)." -}}
{{- end -}}
{{- if include "kvpool.ha" . -}}
{{- $etcdTls := .Values.etcd.tls -}}
{{- if and $etcdTls.certManager.enabled (not (or $etcdTls.certManager.issuerRef.name $tls.certManager.issuerRef.name)) -}}
{{- fail "etcd.tls.certManager.enabled is true but no issuer is named: set etcd.tls.certManager.issuerRef.name (or tls.certManager.issuerRef.name, which it defaults to)." -}}
{{- end -}}
{{- if and (not $etcdTls.certManager.enabled) (not (include "kvpool.etcd.tls.clientSecretName" .)) -}}
{{- fail "etcd.tls.existingSecret is empty: the masters reach etcd over TLS with a client certificate. Name a Secret with ca.crt, tls.crt and tls.key in etcd.tls.existingSecret (or etcd.tls.clientExistingSecret), or set etcd.tls.certManager.enabled=true, or auth.insecure=true (development only)." -}}
{{- end -}}
{{- if and (eq .Values.etcd.mode "bundled") (not $etcdTls.certManager.enabled) (not $etcdTls.existingSecret) -}}
{{- fail "etcd.tls.existingSecret is empty: the bundled etcd serves its clients and peers over TLS. Name a Secret with the members' certificate (ca.crt, tls.crt, tls.key) in etcd.tls.existingSecret, or set etcd.tls.certManager.enabled=true, or auth.insecure=true (development only)." -}}
{{- end -}}
{{- if eq .Values.etcd.mode "external" -}}
{{- range .Values.etcd.external.endpoints -}}
{{- if hasPrefix "http://" . -}}
{{- fail (printf "etcd.external.endpoints lists %s, a plaintext URL: the masters reach etcd over TLS with a client certificate (etcd.tls). Use https:// endpoints, or set auth.insecure=true (no TLS, no authentication; development only)." .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* NetworkPolicy peers: the pods of this release (as a YAML list). */}}
{{- define "kvpool.policy.releasePeers" -}}
{{- $labels := dict "app.kubernetes.io/name" (include "kvpool.name" .) "app.kubernetes.io/instance" .Release.Name -}}
{{- toYaml (list (dict "podSelector" (dict "matchLabels" $labels))) -}}
{{- end -}}

{{/*
NetworkPolicy peers admitted to the HTTP ports besides networkPolicy.metricsFrom (as a YAML
list): this release's pods and networkPolicy.extraFrom, not the client pods (a master's
/metrics names tenants and what each holds, which one tenant's clients must not see).
*/}}
{{- define "kvpool.policy.operatorPeers" -}}
{{- toYaml (concat (include "kvpool.policy.releasePeers" . | fromYamlArray) .Values.networkPolicy.extraFrom) -}}
{{- end -}}

{{/*
NetworkPolicy peers admitted where clients are (as a YAML list): this release's pods, the client
pods (networkPolicy.clientPodSelector, in the release's namespace or in those of
networkPolicy.clientNamespaceSelector), and networkPolicy.extraFrom.
*/}}
{{- define "kvpool.policy.clientPeers" -}}
{{- $np := .Values.networkPolicy -}}
{{- $client := dict "podSelector" $np.clientPodSelector -}}
{{- if $np.clientNamespaceSelector -}}
{{- $_ := set $client "namespaceSelector" $np.clientNamespaceSelector -}}
{{- end -}}
{{- toYaml (concat (include "kvpool.policy.releasePeers" . | fromYamlArray) (list $client) $np.extraFrom) -}}
{{- end -}}

{{/* ------------------------------------------------------------------------- validation */}}

{{/*
The UCX transports of a UCX_TLS value that may reach other hosts, as a JSON list; empty when it
names local ones only. As the storage node reads it (storage_node/main.py,
_non_local_transports): every name that is not a local transport (empty ones are skipped),
and the whole value where it is empty (UCX's defaults) or excludes ("^...": all the others).
*/}}
{{- define "kvpool.ucxTls.nonLocal" -}}
{{- $local := list "sm" "shm" "mm" "self" "cma" "posix" "sysv" "xpmem" "knem" "cuda" "cuda_copy" "cuda_ipc" "gdr_copy" "rocm" "rocm_copy" "rocm_ipc" "rocm_gdr" "ze_copy" "ze_ipc" -}}
{{- $value := trim (toString .) -}}
{{- $wider := list -}}
{{- if or (not $value) (hasPrefix "^" $value) -}}
{{- $wider = list (default "UCX's defaults" $value) -}}
{{- else -}}
{{- range (splitList "," $value) -}}
{{- $name := . | trim | lower -}}
{{- if and $name (not (has (first (splitList ":" $name)) $local)) -}}
{{- $wider = append $wider $name -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $wider -}}
{{- end -}}

{{/*
Refuses, on an upgrade, a bundled etcd whose member count would change: call with
(dict "ctx" $ "running" <the StatefulSet now in the cluster, or an empty dict>). New members
would start with --initial-cluster-state=new and a cluster list the running members never
agreed to: they never join (etcd: "cluster ID mismatch"), and fewer members leave the removed
ones in the membership, counted against the quorum.
*/}}
{{- define "kvpool.etcd.checkMemberCount" -}}
{{- $running := .running | default dict -}}
{{- $spec := get $running "spec" | default dict -}}
{{- if hasKey $spec "replicas" -}}
{{- $was := int (get $spec "replicas") -}}
{{- $want := int .ctx.Values.etcd.bundled.replicas -}}
{{- if ne $was $want -}}
{{- fail (printf "etcd.bundled.replicas is %d but the bundled etcd (StatefulSet %s) runs %d members: an etcd cluster's member count cannot be changed by an upgrade (new members would start a cluster of their own and never join; removed ones would stay members, counted against the quorum). Keep etcd.bundled.replicas=%d, or change the count as described in docs/kubernetes.md, \"Changing the number of etcd members\"." $want (include "kvpool.etcd.fullname" .ctx) $was $was) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A size value in bytes, refused above the largest segment a node maps (128 TiB). */}}
{{- define "kvpool.segmentBytes" -}}
{{- $bytes := include "kvpool.bytes" . | int64 -}}
{{- if gt $bytes 140737488355328 -}}
{{- fail (printf "%s is %s: at most 128Ti (a segment is mapped whole into the storage node's address space, which the node refuses beyond that)" .key (toString .value)) -}}
{{- end -}}
{{- $bytes -}}
{{- end -}}

{{/*
Refuses values that render but could not work: the pods would crash-loop, or the cluster
would open what it says it keeps shut. Included by the master workload (always rendered).
*/}}
{{- define "kvpool.validate" -}}
{{- $s := .Values.storage -}}
{{- $np := .Values.networkPolicy -}}
{{- $_ := include "kvpool.segmentBytes" (dict "key" "storage.dram" "value" $s.dram) -}}
{{- if $s.nvme.enabled -}}
{{- $_ = include "kvpool.segmentBytes" (dict "key" "storage.nvme.size" "value" $s.nvme.size) -}}
{{- end -}}
{{- if and (include "kvpool.secure" .) (not $s.ucxTcp) -}}
{{- range $s.extraEnv -}}
{{- if eq .name "UCX_TLS" -}}
{{- $wider := include "kvpool.ucxTls.nonLocal" .value | fromJsonArray -}}
{{- if $wider -}}
{{- fail (printf "storage.extraEnv sets UCX_TLS=%q, which names transports that reach other hosts (%s): the storage nodes would offer their memory over UCX to peers elsewhere, with one-sided reads and writes they do not check (docs/security.md), so they refuse to start that way. Transfers between hosts go over the checked stream (storage.dataPort): drop UCX_TLS from storage.extraEnv or name local transports only (sm, self, cma, posix, sysv, xpmem, knem), or, on a network only trusted peers reach, set storage.ucxTcp=true to offer UCX over TCP on purpose." .value (join ", " $wider)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if include "kvpool.etcd.bundled" . -}}
{{- $e := .Values.etcd.bundled -}}
{{- if and (not $e.persistence.enabled) (gt (int $e.replicas) 1) -}}
{{- fail (printf "etcd.bundled.persistence.enabled is false with etcd.bundled.replicas=%d: a member whose pod is replaced comes back with an empty data directory and cannot rejoin the cluster that still lists it (etcd: \"member ... has already been bootstrapped\"); it crash-loops, and every replaced pod takes the quorum closer to lost. Turn etcd.bundled.persistence.enabled on, or run one member (etcd.bundled.replicas=1: a restart empties it, development only)." (int $e.replicas)) -}}
{{- end -}}
{{- if .Release.IsUpgrade -}}
{{- /* (lookup answers nothing in helm template and a client-side dry run: nothing to compare) */ -}}
{{- $running := lookup "apps/v1" "StatefulSet" .Release.Namespace (include "kvpool.etcd.fullname" .) -}}
{{- include "kvpool.etcd.checkMemberCount" (dict "ctx" . "running" $running) -}}
{{- end -}}
{{- end -}}
{{- if and $np.enabled $s.hostNetwork -}}
{{- $ipBlocks := list -}}
{{- range $np.extraFrom -}}
{{- if hasKey . "ipBlock" -}}{{- $ipBlocks = append $ipBlocks . -}}{{- end -}}
{{- end -}}
{{- if not $ipBlocks -}}
{{- fail "storage.hostNetwork is true and networkPolicy.enabled is true, but networkPolicy.extraFrom has no ipBlock: host-network storage nodes reach the master from their hosts' addresses, which no pod selector matches, so the master's NetworkPolicy would shut them out (no node would ever register). Add the hosts' addresses to networkPolicy.extraFrom (e.g. [{ipBlock: {cidr: 10.0.0.0/16}}], the node network's CIDR), or set networkPolicy.enabled=false." -}}
{{- end -}}
{{- end -}}
{{- end -}}
