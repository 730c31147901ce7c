"""The Helm chart in helm/kvpool: lint, render, Kubernetes schemas, and its ties to the code.

Everything runs the real tools: Helm's Go SDK through helm-python-sdk (lint, template, the values
schema), kubernetes-validate's strict OpenAPI schemas for two Kubernetes versions, the real
``kvpool`` argument parser, and the Prometheus registry the kvpool processes export.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

# The `test` extra installs these: missing, they fail the run (never skip the chart tests).
import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from kvpool.cli.main import build_parser
from kvpool.common.master_address import resolve_master
from kvpool.common.sizes import parse_size
from kvpool.master.main import config_from_args
from kvpool.storage_node.main import LOCAL_TRANSPORT_NAMES

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "helm" / "kvpool"
#: Custom resources: no Kubernetes OpenAPI schema covers them, so kubernetes-validate cannot
#: check them offline; they are checked structurally instead (test_service_monitor_*,
#: test_cert_manager_*).
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("cert-manager.io/v1", "Certificate"),
}

Renderer = Callable[[dict[str, Any]], dict[str, str]]

#: A rendered release (conftest.Render); value sets are parametrized by conftest too.
Render = Any


# --------------------------------------------------------------------------- helpers


def rejected(render: Renderer, values: dict[str, Any]) -> str:
    """The error Helm gives for values it must refuse (schema or template ``fail``)."""
    with pytest.raises(helm.HelmError) as caught:
        render(values)
    return str(caught.value)


def quantity_bytes(text: str | int) -> int:
    """A Kubernetes memory quantity in bytes (the forms this chart renders)."""
    match = re.fullmatch(r"([0-9]+)(Ki|Mi|Gi|Ti)?", str(text))
    assert match, f"unexpected quantity {text!r}"
    scale = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    return int(match.group(1)) * scale[match.group(2)]


def expand(args: list[str], container: dict[str, Any]) -> list[str]:
    """Expands $(VAR) as the kubelet does; every reference must name a variable of the container
    (the kubelet would pass an undefined one through verbatim)."""
    defined = {env["name"]: f"<{env['name']}>" for env in container.get("env", [])}

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in defined, f"$({name}) is used but the container defines no {name}"
        return defined[name]

    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", substitute, arg) for arg in args]


class CliRejected(Exception):
    pass


def parse_cli(argv: list[str]) -> Any:
    """Parses a command line with the real ``kvpool`` parser; CliRejected carries its message."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return build_parser().parse_args(argv)
    except SystemExit as exit_:
        raise CliRejected(stderr.getvalue().strip() or f"exit {exit_.code}") from None


def container_argv(container: dict[str, Any]) -> list[str]:
    assert container["command"] == ["kvpool"], "the chart runs the kvpool entry point"
    return expand(container["args"], container)


def named_port(container: dict[str, Any], name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return port


# --------------------------------------------------------------------------- lint


def test_lint_strict(
    value_sets: dict[str, dict[str, Any]], value_set: str, kube_version: str
) -> None:
    report = helm.lint(
        str(CHART_DIR), value_sets[value_set], strict=True, kube_version=f"v{kube_version}.0"
    )
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # warnings and errors
    assert report["errors"] == [], report
    assert problems == [], report


def test_lint_reports_schema_violations() -> None:
    report = helm.lint(str(CHART_DIR), {"storage": {"dram": "-1Gi"}}, strict=True)
    assert any("/storage/dram" in error for error in report["errors"]), report


# --------------------------------------------------------------------------- render + schemas


def test_renders(renders: dict[str, Render], value_set: str) -> None:
    render = renders[value_set]
    kinds = {o["kind"] for o in render.objects}
    assert {"Service", "ServiceAccount"} <= kinds
    # one master: a Deployment; several: a StatefulSet (a DNS name per master)
    assert _workload(render, "master")["kind"] == (
        "StatefulSet" if render.values["master"]["replicas"] > 1 else "Deployment"
    )
    assert kinds & {"DaemonSet", "StatefulSet"}
    for obj in render.objects:
        assert obj["metadata"]["namespace"] == render.namespace or obj["kind"] == "Namespace"
        assert len(obj["metadata"]["name"]) <= 63


def test_manifests_pass_strict_kubernetes_schemas(
    renders: dict[str, Render], value_set: str, kube_version: str
) -> None:
    checked = 0
    for obj in renders[value_set].objects:
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            continue  # validated structurally in test_service_monitor_*
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} at {path}: {error.message}")
        checked += 1
    assert checked >= 6


def test_kubernetes_validate_cli_strict(
    renders: dict[str, Render], kube_versions: tuple[str, ...], tmp_path: Path
) -> None:
    """The same check through the `kubernetes-validate --strict` command line, both versions."""
    files = []
    for name, render in renders.items():
        docs = [o for o in render.objects if (o["apiVersion"], o["kind"]) not in CRD_KINDS]
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump_all(docs))
        files.append(str(path))
    versions = [arg for v in kube_versions for arg in ("-k", v)]
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", *versions, *files],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ERROR" not in result.stdout and "WARN" not in result.stdout, result.stdout


def test_daemonset_nvme_claim_is_a_generic_ephemeral_volume(
    render: Renderer, kube_versions: tuple[str, ...]
) -> None:
    values = {"storage": {"kind": "DaemonSet", "nvme": {"enabled": True, "source": "pvc"}}}
    objects = [
        d
        for p, t in render(values).items()
        if p.endswith(".yaml")
        for d in yaml.safe_load_all(t)
        if d
    ]
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    claim = volumes["nvme"]["ephemeral"]["volumeClaimTemplate"]["spec"]
    assert claim["resources"]["requests"]["storage"] == "100Gi"
    for version in kube_versions:
        kubernetes_validate.validate(daemonset, version, strict=True)


# --------------------------------------------------------------------------- scenarios


def test_default_is_one_master_and_a_daemonset_without_etcd(renders: dict[str, Render]) -> None:
    render = renders["default"]
    master = render.get("Deployment", f"{render.fullname}-master")
    assert master["spec"]["replicas"] == 1
    assert master["spec"]["strategy"]["type"] == "Recreate"  # never two masters at once
    render.get("DaemonSet", f"{render.fullname}-node")
    assert not [o for o in render.objects if "etcd" in o["metadata"]["name"]]
    assert not render.of_kind("ServiceMonitor") and not render.of_kind("ConfigMap")
    service = render.get("Service", f"{render.fullname}-master")
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports == {"grpc": 50051, "lane": 50052, "http": 9090}


def test_a_lone_master_keeps_its_tombstones_in_a_file_on_an_emptydir(
    renders: dict[str, Render], render_release: Callable[[dict[str, Any]], Render]
) -> None:
    render = renders["default"]
    container = render.container("master")
    args = parse_cli(container_argv(container))
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert str(args.tombstone_file.parent) == mounts["tombstones"]
    volumes = {
        v["name"]: v for v in _pod(render.get("Deployment", f"{render.fullname}-master"))["volumes"]
    }
    assert volumes["tombstones"]["emptyDir"] == {"sizeLimit": "256Mi"}
    for ha in ("ha-bundled-etcd", "external-etcd"):  # (the records live in etcd)
        assert parse_cli(container_argv(renders[ha].container("master"))).tombstone_file is None
    off = render_release({"master": {"tombstoneFile": {"enabled": False}}})
    assert parse_cli(container_argv(off.container("master"))).tombstone_file is None
    assert "tombstones" not in {m["name"] for m in off.container("master")["volumeMounts"]}


def test_ha_masters_share_a_capability_key_file_from_a_secret_when_one_is_named(
    renders: dict[str, Render],
) -> None:
    """One key file for every master (kvpool capability-keys create), mounted whole so that a
    rotated Secret reaches the running masters; without it each master makes its own."""
    render = renders["ha-bundled-etcd"]
    container = render.container("master")
    path = parse_cli(container_argv(container)).capability_key_file
    pod = _pod(render.get("StatefulSet", f"{render.fullname}-master"))
    assert _secret_files(pod, container)[str(path)] == (
        "kvpool-capability-keys",
        "capability-keys.json",
    )
    assert not any("subPath" in m for m in container["volumeMounts"])
    for name in ("default", "external-etcd"):
        assert (
            parse_cli(container_argv(renders[name].container("master"))).capability_key_file is None
        )


def test_single_master_statefulset_nodes(renders: dict[str, Render]) -> None:
    render = renders["single-master"]
    nodes = render.get("StatefulSet", f"{render.fullname}-node")
    assert nodes["spec"]["replicas"] == 3
    assert nodes["spec"]["serviceName"] == f"{render.fullname}-node"
    headless = render.get("Service", f"{render.fullname}-node")
    assert headless["spec"]["clusterIP"] == "None"
    assert (
        render.get("PodDisruptionBudget", f"{render.fullname}-node")["spec"]["maxUnavailable"]
        == "34%"
    )
    assert "--etcd" not in " ".join(render.container("master")["args"])
    service = render.get("Service", f"{render.fullname}-master")
    assert "lane" not in {p["name"] for p in service["spec"]["ports"]}  # lanePort: 0


def test_ha_masters_with_bundled_etcd(renders: dict[str, Render]) -> None:
    render = renders["ha-bundled-etcd"]
    assert render.get("StatefulSet", f"{render.fullname}-master")["spec"]["replicas"] == 3
    etcd = render.get("StatefulSet", f"{render.fullname}-etcd")
    assert etcd["spec"]["replicas"] == 3
    assert etcd["spec"]["podManagementPolicy"] == "Parallel"
    (member,) = etcd["spec"]["template"]["spec"]["containers"]
    assert member["image"].startswith("quay.io/coreos/etcd:v3.")
    headless = render.get("Service", f"{render.fullname}-etcd-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert etcd["spec"]["serviceName"] == headless["metadata"]["name"]
    domain = f"{render.fullname}-etcd-headless.{render.namespace}.svc"
    pods = [f"{render.fullname}-etcd-{i}" for i in range(3)]
    initial = next(a for a in member["args"] if a.startswith("--initial-cluster="))
    assert initial == "--initial-cluster=" + ",".join(
        f"{p}=https://{p}.{domain}:2380" for p in pods
    )
    args = parse_cli(container_argv(render.container("master")))
    assert args.etcd == ",".join(f"https://{p}.{domain}:2379" for p in pods)
    assert args.cluster == "kv-prod"
    pdb = render.get("PodDisruptionBudget", f"{render.fullname}-etcd")
    assert pdb["spec"]["minAvailable"] == 2  # the quorum of three
    claim = etcd["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["resources"]["requests"]["storage"] == "2Gi"
    assert claim["storageClassName"] == "fast-ssd"


def test_ha_masters_with_external_etcd(renders: dict[str, Render]) -> None:
    render = renders["external-etcd"]
    assert not [o for o in render.objects if "etcd" in o["metadata"]["name"]]
    args = parse_cli(container_argv(render.container("master")))
    assert args.etcd == ",".join(render.values["etcd"]["external"]["endpoints"])
    assert args.cluster == render.fullname  # default cluster name: the release's full name
    master = render.get("StatefulSet", f"{render.fullname}-master")
    assert master["spec"]["updateStrategy"]["type"] == "RollingUpdate"


HA_VALUE_SETS = ("ha-bundled-etcd", "external-etcd", "cert-manager-mtls", "insecure-dev")


def _names(pattern: str, host: str) -> bool:
    """Whether a certificate's DNS name ``pattern`` (``*.`` standing for one label) names
    ``host``, as TLS hostname verification matches it."""
    if pattern.startswith("*."):
        label, _, rest = host.partition(".")
        return bool(label) and rest == pattern[2:]
    return pattern == host


@pytest.mark.parametrize("ha_set", HA_VALUE_SETS)
def test_ha_masters_advertise_a_name_of_their_own_that_the_certificate_carries(
    renders: dict[str, Render], ha_set: str
) -> None:
    """(The masters advertised their pod IP, which no certificate named: a caller a standby
    sent to the leader failed TLS hostname verification there, for good.)"""
    render = renders[ha_set]
    name, ns = render.fullname, render.namespace
    masters = render.get("StatefulSet", f"{name}-master")
    headless = render.get("Service", f"{name}-master-headless")
    assert masters["spec"]["serviceName"] == headless["metadata"]["name"]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True  # (a starting master resolves)
    assert "http" not in {p["name"] for p in headless["spec"]["ports"]}  # (scraped once)
    container = render.container("master")
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "POD_IP" not in env  # (an IPv6 pod IP would have needed brackets, too)
    advertise = parse_cli(container_argv(container)).advertise
    pod = f"{name}-master-1"  # (what Kubernetes substitutes for $(POD_NAME))
    address = advertise.replace("<POD_NAME>", pod)  # (container_argv writes $(POD_NAME) so)
    assert address == f"{pod}.{name}-master-headless.{ns}.svc:50051"
    assert resolve_master(address) == address  # a master address clients and nodes accept
    certificates = [
        c for c in render.of_kind("Certificate") if c["metadata"]["name"] == f"{name}-master"
    ]
    if certificates:  # cert-manager: the certificate names every master pod, and the Service
        host = address.rpartition(":")[0]
        (certificate,) = certificates
        assert any(_names(n, host) for n in certificate["spec"]["dnsNames"]), host
        assert any(_names(n, f"{host}.cluster.local") for n in certificate["spec"]["dnsNames"])
        assert not any(
            _names(n, f"{pod}.{name}-etcd-headless.{ns}.svc")
            for n in certificate["spec"]["dnsNames"]
        )  # (only the masters' domain)


def test_one_master_advertises_nothing_and_needs_no_headless_service(
    renders: dict[str, Render], render: Renderer
) -> None:
    single = renders["default"]
    assert parse_cli(container_argv(single.container("master"))).advertise is None
    assert "master-headless" not in {s["metadata"]["name"] for s in single.of_kind("Service")}
    values = {"tls": {"certManager": {"enabled": True, "issuerRef": {"name": "ca"}}}}
    objects = [d for p, t in render(values).items() if p.endswith(".yaml") for d in _docs(t)]
    (certificate,) = [o for o in objects if o["kind"] == "Certificate"]
    assert not any(n.startswith("*.") for n in certificate["spec"]["dnsNames"])


@pytest.mark.parametrize("ha_set", HA_VALUE_SETS)
def test_ha_masters_can_be_rolled_and_drained(renders: dict[str, Render], ha_set: str) -> None:
    """(Only the leader was ready, the standbys answering 503 on /readyz: a rolling update
    waited forever for a new pod to turn ready, and the PodDisruptionBudget never allowed an
    eviction.) A master is ready while it could lead, as leader or as a standby that etcd
    answers; callers the Service sends to a standby are told where the leader is. (A standby
    cut off from etcd was ready too, on /healthz: it is not.)"""
    import urllib.error
    import urllib.request

    from kvpool.common.http_server import HealthServer

    render = renders[ha_set]
    master = render.values["master"]
    masters = _workload(render, "master")
    assert masters["kind"] == "StatefulSet"
    assert masters["spec"]["updateStrategy"] == {"type": "RollingUpdate"}
    probe = render.container("master")["readinessProbe"]["httpGet"]
    # What a standby answers there (master/main.py's checks, whose session state
    # tests/ha/test_readiness.py drives with a real etcd): ready while etcd answers it, not
    # once it cannot campaign; and /readyz, the leader's own, is 503 either way.
    in_touch = [True]

    def any_role() -> tuple[bool, str]:
        if in_touch[0]:
            return True, "standby; the leader is x"
        return False, "standby; etcd unreachable since ..."

    standby = HealthServer(
        "127.0.0.1", 0, readiness=lambda: (False, "standby; the leader is x"), any_role=any_role
    )
    standby.start()
    try:
        url = f"http://127.0.0.1:{standby.port}"
        with urllib.request.urlopen(url + probe["path"], timeout=5) as answer:
            assert answer.status == 200
        with pytest.raises(urllib.error.HTTPError, match="503"):
            urllib.request.urlopen(url + "/readyz", timeout=5)
        in_touch[0] = False
        with pytest.raises(urllib.error.HTTPError, match="503"):
            urllib.request.urlopen(url + probe["path"], timeout=5)
        with urllib.request.urlopen(url + "/healthz", timeout=5) as answer:
            assert answer.status == 200  # (alive all the same: liveness restarts nothing)
    finally:
        standby.stop()
    # Every master ready: the budget allows an eviction (the Kubernetes disruption
    # controller's disruptionsAllowed = currentHealthy - desiredHealthy).
    budget = render.get("PodDisruptionBudget", f"{render.fullname}-master")["spec"]
    healthy = master["replicas"]
    assert healthy - (master["replicas"] - budget["maxUnavailable"]) >= 1


def test_masters_read_a_quotas_file_from_a_secret_when_one_is_named(
    renders: dict[str, Render], render_release: Callable[[dict[str, Any]], Render]
) -> None:
    """(The chart had no way to give the master --quotas: no value, no volume, a read-only
    root filesystem.) The Secret is mounted whole, so that an update reaches the masters."""
    for render in (
        renders["ha-bundled-etcd"],
        render_release({"auth": {"quotasSecret": "q"}}),
        render_release({"auth": {"quotasSecret": "q", "insecure": True}}),
    ):
        container = render.container("master")
        path = str(parse_cli(container_argv(container)).quotas)
        assert path == "/etc/kvpool/quotas/quotas.json"
        files = _secret_files(_pod(_workload(render, "master")), container)
        secret = render.values["auth"]["quotasSecret"]
        assert files[path] == (secret, "quotas.json")
        assert not any("subPath" in m for m in container["volumeMounts"])
    for name in ("default", "external-etcd"):
        assert parse_cli(container_argv(renders[name].container("master"))).quotas is None


def test_nvme_through_a_claim_per_statefulset_pod(renders: dict[str, Render]) -> None:
    render = renders["nvme-pvc"]
    nodes = render.get("StatefulSet", f"{render.fullname}-node")
    (template,) = nodes["spec"]["volumeClaimTemplates"]
    assert template["metadata"]["name"] == "nvme"
    assert template["spec"]["resources"]["requests"]["storage"] == "220Gi"
    assert template["spec"]["storageClassName"] == "local-nvme"
    container = render.container("node")
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["nvme"] == "/var/lib/kvpool/nvme"
    args = container["args"]
    assert args[args.index("--nvme") + 1] == "/var/lib/kvpool/nvme"
    assert args[args.index("--nvme-size") + 1] == "200Gi"


def test_nvme_through_a_host_path(renders: dict[str, Render]) -> None:
    render = renders["nvme-hostpath-daemonset"]
    nodes = render.get("DaemonSet", f"{render.fullname}-node")
    volumes = {v["name"]: v for v in nodes["spec"]["template"]["spec"]["volumes"]}
    assert volumes["nvme"]["hostPath"] == {"path": "/mnt/nvme0/kvpool", "type": "Directory"}
    args = render.container("node")["args"]
    # The node keeps its segment in this release's directory of the host's (it creates it).
    assert args[args.index("--nvme") + 1] == f"/nvme/{render.namespace}_{render.fullname}"
    assert args[args.index("--nvme-size") + 1] == "1Ti"


def test_nvme_flags_only_when_nvme_is_enabled(renders: dict[str, Render], value_set: str) -> None:
    render = renders[value_set]
    container = render.container("node")
    has_flags = any(a.startswith("--nvme") for a in container["args"])
    has_mount = any(m["name"] == "nvme" for m in container["volumeMounts"])
    assert has_flags == has_mount == render.values["storage"]["nvme"]["enabled"]


def test_drain_on_termination_gets_a_grace_period_sized_from_the_data(
    renders: dict[str, Render],
) -> None:
    """SIGTERM drains (--drain-on-term) under a deadline sized from what the node holds (its
    DRAM and NVMe segments) at the master's re-replication rate, and Kubernetes waits that
    long, plus the readers' leases, before it kills the pod."""
    render = renders["drain-warm-restart"]
    values = render.values
    args = parse_cli(container_argv(render.container("node")))
    rate = parse_size(values["master"]["rereplicationRate"])
    held = parse_size(values["storage"]["dram"]) + parse_size(values["storage"]["nvme"]["size"])
    assert args.drain_on_term is True
    assert args.drain_timeout == -(-held // rate) + 60
    pod = _pod(render.get("StatefulSet", f"{render.fullname}-node"))
    assert pod["terminationGracePeriodSeconds"] >= args.drain_timeout + values["master"]["leaseTtl"]
    master = parse_cli(container_argv(render.container("master")))
    assert master.rereplication_rate == rate
    assert config_from_args(master).rereplication_rate == rate


def test_warm_restart_keeps_the_dram_segment_in_a_host_shared_memory_directory(
    renders: dict[str, Render],
) -> None:
    render = renders["drain-warm-restart"]
    warm = render.values["storage"]["warmRestart"]
    container = render.container("node")
    args = parse_cli(container_argv(container))
    assert args.dram_shm is True
    # this release's directory in the host's (the node creates it): see test_two_releases_*
    assert args.shm_dir == f"{warm['mountPath']}/{render.namespace}_{render.fullname}"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["shm"] == warm["mountPath"]
    volumes = {
        v["name"]: v for v in _pod(render.get("StatefulSet", f"{render.fullname}-node"))["volumes"]
    }
    assert volumes["shm"]["hostPath"] == {"path": "/dev/shm/kvpool", "type": "DirectoryOrCreate"}
    assert args.node_id == "<POD_NAME>", "a stable id: the restarted pod reports under it"


def test_no_drain_or_warm_restart_unless_asked(renders: dict[str, Render], value_set: str) -> None:
    render = renders[value_set]
    storage = render.values["storage"]
    args = parse_cli(container_argv(render.container("node")))
    assert args.drain_on_term is storage["drain"]["onTermination"]
    assert args.dram_shm is storage["warmRestart"]["enabled"]
    if not storage["drain"]["onTermination"]:
        pod = _pod(_workload(render, "node"))
        assert pod["terminationGracePeriodSeconds"] == storage["terminationGracePeriodSeconds"]


def test_master_extra_env_reaches_the_masters_single_and_ha(render_release) -> None:
    """How an operator changes the metadata lane's connection caps (docs/security.md)."""
    env = [{"name": "KVPOOL_MASTER_LANE_MAX_PER_IDENTITY", "value": "2048"}]
    for replicas in (1, 3):
        render = render_release({"master": {"replicas": replicas, "extraEnv": env}})
        given = render.container("master")["env"]
        assert env[0] in given
        assert ("POD_NAME" in {e["name"] for e in given}) is (replicas > 1)
    ours = [{"name": "POD_NAME", "value": "master-x"}]
    assert "sets POD_NAME" in rejected(render_release, {"master": {"extraEnv": ours}})


def test_rejects_drain_without_a_rereplication_rate(render: Renderer) -> None:
    values = {"master": {"rereplicationRate": "0"}, "storage": {"drain": {"onTermination": True}}}
    assert "rereplicationRate" in rejected(render, values)


def test_host_network_daemonset(renders: dict[str, Render]) -> None:
    render = renders["hostnetwork-daemonset"]
    pod = render.get("DaemonSet", f"{render.fullname}-node")["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"  # still resolves the master Service
    container = render.container("node")
    args = parse_cli(container_argv(container))
    assert args.http_port == named_port(container, "http") == 19091
    assert {"name": "UCX_LOG_LEVEL", "value": "warn"} in container["env"]  # (extraEnv)
    assert "UCX_TLS" not in {e["name"] for e in container["env"]}  # (shared memory only)
    # The nodes reach the master from their hosts' addresses: an ipBlock admits them.
    master = render.get("NetworkPolicy", f"{render.fullname}-master")
    peers = [p for rule in master["spec"]["ingress"] for p in rule["from"]]
    assert {"ipBlock": {"cidr": "10.0.0.0/16"}} in peers
    for name, other in renders.items():
        if name != "hostnetwork-daemonset":
            pod = other.container("node")
            assert "hostNetwork" not in str(other.workloads()), name
            assert pod["ports"][0]["containerPort"] == 9091


# --------------------------------------------------------------------------- resources, security


def test_node_memory_covers_the_segment(renders: dict[str, Render], value_set: str) -> None:
    render = renders[value_set]
    storage = render.values["storage"]
    needed = parse_size(storage["dram"]) + parse_size(storage["memory"]["overhead"])
    resources = render.container("node")["resources"]
    request = quantity_bytes(resources["requests"]["memory"])
    limit = quantity_bytes(resources["limits"]["memory"])
    assert needed <= request <= limit
    if not storage["memory"]["limit"]:
        assert limit == needed
    else:
        assert limit == parse_size(storage["memory"]["limit"])


def test_fractional_sizes_add_up(render: Renderer) -> None:
    files = render({"storage": {"dram": "1.5Gi", "memory": {"overhead": "512Mi"}}})
    node = yaml.safe_load(files["kvpool/templates/node-workload.yaml"])
    resources = node["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"] == "2Gi"


def test_pods_run_as_non_root_without_capabilities(
    renders: dict[str, Render], value_set: str
) -> None:
    for workload in renders[value_set].workloads():
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] > 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        for container in pod["containers"] + pod.get("initContainers", []):
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert not context.get("privileged")


def test_every_workload_has_a_disruption_budget(renders: dict[str, Render], value_set: str) -> None:
    render = renders[value_set]
    budgets = [p["spec"]["selector"]["matchLabels"] for p in render.of_kind("PodDisruptionBudget")]
    for workload in render.workloads():
        assert workload["spec"]["selector"]["matchLabels"] in budgets, workload["metadata"]["name"]


def test_services_select_pods_and_name_their_ports(
    renders: dict[str, Render], value_set: str
) -> None:
    render = renders[value_set]
    for service in render.of_kind("Service"):
        selector = service["spec"]["selector"]
        targets = [
            w
            for w in render.workloads()
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(targets) == 1, service["metadata"]["name"]
        container_ports = {
            p["name"]
            for c in targets[0]["spec"]["template"]["spec"]["containers"]
            for p in c["ports"]
        }
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in container_ports


# --------------------------------------------------------------------------- the CLI


def test_master_command_parses(renders: dict[str, Render], value_set: str) -> None:
    render = renders[value_set]
    container = render.container("master")
    args = parse_cli(container_argv(container))
    master = render.values["master"]
    assert args.command == "master"
    assert args.port == named_port(container, "grpc") == master["grpcPort"]
    if master["lanePort"]:  # the lane's port is opened where the master listens
        assert args.lane_port == named_port(container, "lane") == master["lanePort"]
    else:
        assert args.lane_port == -1
    assert args.http_port == named_port(container, "http") == master["httpPort"]
    assert args.default_replicas == master["defaultReplicas"]
    assert args.lease_ttl == master["leaseTtl"]
    assert args.node_ttl == master["nodeTtl"]
    assert args.log_format == "json"
    config_from_args(args)  # the master's own validation accepts the configuration
    if master["replicas"] > 1:
        assert args.etcd and args.cluster
    else:
        assert args.etcd is None


def test_node_command_parses(renders: dict[str, Render], value_set: str) -> None:
    render = renders[value_set]
    container = render.container("node")
    argv = container_argv(container)
    storage = render.values["storage"]
    args = parse_cli(argv)  # CliRejected (a failure) carries the parser's complaint
    assert args.command == "node"
    assert args.master == _node_master_address(render) == resolve_master(args.master)
    assert args.dram == parse_size(storage["dram"])
    assert args.prefault is storage["prefault"]
    assert args.host == "<K8S_NODE_NAME>"
    env = {e["name"]: e for e in container["env"]}
    assert env["K8S_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert args.http_port == named_port(container, "http") == storage["httpPort"]
    # Secure: the id its token is bound to, the pod's name or a DaemonSet's Kubernetes node.
    # Insecure: the same stable id where a segment outlives the pod (warm restart, NVMe), else
    # the CLI's default (a fresh id each start).
    id_var = "POD_NAME" if storage["kind"] == "StatefulSet" else "K8S_NODE_NAME"
    insecure = render.values["auth"]["insecure"]
    persistent = storage["warmRestart"]["enabled"] or storage["nvme"]["enabled"]
    assert args.node_id == (f"<{id_var}>" if not insecure or persistent else None)
    assert args.insecure is insecure
    assert args.log_format == "json"
    if storage["nvme"]["enabled"]:
        nvme = storage["nvme"]
        per_release = nvme["source"] == "hostPath" and nvme["hostPath"]["perRelease"]
        release_dir = f"/{render.namespace}_{render.fullname}" if per_release else ""
        assert args.nvme == [nvme["mountPath"] + release_dir]
        assert args.nvme_size == [parse_size(storage["nvme"]["size"])]
    else:
        assert args.nvme == [] and args.nvme_size == []


def _node_master_address(render: Render) -> str:
    """Nodes reach a lone master through its Service, elected masters through etcd on an
    insecure cluster (a secure one's etcd wants client certificates only masters hold)."""
    master_args = render.container("master")["args"]
    etcd = next((a.split("=", 1)[1] for a in master_args if a.startswith("--etcd=")), None)
    if etcd is None or "--insecure" not in master_args:
        return render.master_address
    cluster = next(a.split("=", 1)[1] for a in master_args if a.startswith("--cluster="))
    endpoints = [e.removeprefix("http://").removeprefix("https://") for e in etcd.split(",")]
    return f"etcd://{','.join(endpoints)}/{cluster}"


def test_probes_hit_the_health_endpoints(renders: dict[str, Render], value_set: str) -> None:
    render = renders[value_set]
    for component in ("master", "node"):
        container = render.container(component)
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        # several masters: a standby that can campaign is ready too (/readyz is the leader's)
        ha = component == "master" and render.values["master"]["replicas"] > 1
        path = "/readyz?role=any" if ha else "/readyz"
        assert container["readinessProbe"]["httpGet"] == {"path": path, "port": "http"}
    assert render.container("node")["startupProbe"]["httpGet"]["path"] == "/healthz"


def test_master_service_is_what_nodes_and_notes_point_at(renders: dict[str, Render]) -> None:
    render = renders["default"]
    service = render.get("Service", f"{render.fullname}-master")
    grpc = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    address = f"{service['metadata']['name']}.{render.namespace}.svc:{grpc['port']}"
    assert address == render.master_address
    assert f"--master={_node_master_address(render)}" in render.container("node")["args"]
    assert f"KVPOOL_MASTER={address}" in render.notes
    assert "kvpool status" in render.notes


def test_notes_tell_ha_users_how_to_follow_the_leader(renders: dict[str, Render]) -> None:
    insecure = renders["insecure-dev"]
    endpoints, _, cluster = _node_master_address(insecure).removeprefix("etcd://").partition("/")
    assert "elect a leader through etcd" in insecure.notes
    assert f"KVPOOL_MASTER=etcd://{endpoints.split(',')[0]}/{cluster}" in insecure.notes
    secure = renders["ha-bundled-etcd"]
    assert "elect a leader through etcd" in secure.notes
    assert "reach the leader through the master Service" in secure.notes
    assert "etcd://" not in secure.notes
    assert "elect a leader" not in renders["default"].notes


# --------------------------------------------------------------------------- invalid values


def test_rejects_negative_size(render: Renderer) -> None:
    message = rejected(render, {"storage": {"dram": "-4Gi"}})
    assert "at '/storage/dram': '-4Gi' does not match pattern" in message


def test_rejects_malformed_size(render: Renderer) -> None:
    message = rejected(render, {"storage": {"nvme": {"size": "4 gigabytes"}}})
    assert "at '/storage/nvme/size': '4 gigabytes' does not match pattern" in message


def test_rejects_decimal_unit_size(render: Renderer) -> None:
    message = rejected(render, {"storage": {"memory": {"overhead": "512MB"}}})
    assert "at '/storage/memory/overhead': '512MB' does not match pattern" in message


def test_rejects_zero_size(render: Renderer) -> None:
    message = rejected(render, {"storage": {"dram": "0Gi"}})
    assert "at '/storage/dram': '0Gi' does not match pattern" in message


def test_rejects_size_given_as_a_number(render: Renderer) -> None:
    message = rejected(render, {"storage": {"dram": 4096}})
    assert "at '/storage/dram'" in message and "want string" in message


def test_rejects_memory_limit_below_the_segment(render: Renderer) -> None:
    message = rejected(render, {"storage": {"dram": "8Gi", "memory": {"limit": "8Gi"}}})
    assert (
        "storage.memory.limit (8Gi) is below the DRAM segment storage.dram (8Gi) plus "
        "storage.memory.overhead (512Mi) = 8704Mi" in message
    )
    assert "Raise storage.memory.limit to at least 8704Mi" in message


def test_rejects_memory_request_below_the_segment(render: Renderer) -> None:
    message = rejected(render, {"storage": {"memory": {"request": "1Gi"}}})
    assert "storage.memory.request (1Gi) is below the DRAM segment storage.dram (4Gi)" in message


def test_rejects_memory_request_above_limit(render: Renderer) -> None:
    values = {"storage": {"memory": {"request": "8Gi", "limit": "6Gi"}}}
    message = rejected(render, values)
    assert "storage.memory.request (8Gi) is above storage.memory.limit (6Gi)" in message


def test_rejects_unknown_top_level_key(render: Renderer) -> None:
    message = rejected(render, {"replicaCount": 3})
    assert "additional properties 'replicaCount' not allowed" in message


def test_rejects_unknown_nested_key(render: Renderer) -> None:
    message = rejected(render, {"storage": {"nvme": {"sizee": "1Ti"}}})
    assert "at '/storage/nvme': additional properties 'sizee' not allowed" in message


def test_rejects_wrong_type(render: Renderer) -> None:
    message = rejected(render, {"master": {"replicas": "three"}})
    assert "at '/master/replicas'" in message


def test_rejects_unknown_storage_kind(render: Renderer) -> None:
    message = rejected(render, {"storage": {"kind": "Deployment"}})
    assert "at '/storage/kind'" in message and "DaemonSet" in message


def test_rejects_external_etcd_without_endpoints(render: Renderer) -> None:
    message = rejected(render, {"master": {"replicas": 2}, "etcd": {"mode": "external"}})
    assert 'etcd.mode is "external" but etcd.external.endpoints is empty' in message


def test_rejects_nvme_claim_smaller_than_segment(render: Renderer) -> None:
    nvme = {"enabled": True, "source": "pvc", "size": "200Gi", "pvc": {"size": "100Gi"}}
    message = rejected(render, {"storage": {"kind": "StatefulSet", "nvme": nvme}})
    assert "storage.nvme.pvc.size (100Gi) is smaller than the NVMe segment" in message


def test_rejects_root_user(render: Renderer) -> None:
    message = rejected(render, {"securityContext": {"runAsUser": 0}})
    assert "at '/securityContext/runAsUser'" in message


def _object_schemas(node: Any, pointer: str = "#") -> list[tuple[str, dict[str, Any]]]:
    found = []
    if isinstance(node, dict):
        if node.get("type") == "object":
            found.append((pointer, node))
        for key, value in node.items():
            found += _object_schemas(value, f"{pointer}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _object_schemas(value, f"{pointer}/{i}")
    return found


def test_schema_closes_every_object() -> None:
    """additionalProperties is set on every object of the values schema. The only open objects
    are Helm's `global` and the insides of a Kubernetes Affinity, which are API types that the
    API server (and kubernetes-validate, above) check."""
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    open_ok = {
        "#/properties/global",
        "#/definitions/affinity/properties/nodeAffinity",
        "#/definitions/affinity/properties/podAffinity",
        "#/definitions/affinity/properties/podAntiAffinity",
    }
    objects = _object_schemas(schema)
    assert len(objects) > 30
    for pointer, node in objects:
        if pointer not in open_ok:
            assert "additionalProperties" in node, f"{pointer} accepts unknown keys"


def test_schema_is_a_valid_draft_07_schema() -> None:
    """Draft-07 with `definitions`: read alike by Helm 3's and Helm 4's schema validators."""
    import jsonschema

    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    jsonschema.Draft7Validator(schema).validate(values)


def test_every_default_value_is_in_the_schema(chart: Any) -> None:
    chart.validate_schema(yaml.safe_load((CHART_DIR / "values.yaml").read_text()))


# --------------------------------------------------------------------------- metrics


PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "topk", "bottomk", "quantile", "stddev", "by",
    "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
    "offset", "rate", "irate", "increase", "delta", "deriv", "histogram_quantile", "clamp_min",
    "clamp_max", "abs", "vector", "scalar", "time", "absent", "max_over_time", "min_over_time",
    "avg_over_time", "label_replace", "inf", "nan",
}  # fmt: skip
#: Labels Prometheus (through the ServiceMonitor) adds to every scraped series.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "container", "endpoint"}


def promql_references(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression uses."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    labels: set[str] = set()
    for body in re.findall(r"\{([^}]*)\}", expr):
        labels |= set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", body))
    expr = re.sub(r"\{[^}]*\}", "", expr)
    for body in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        labels |= {label.strip() for label in body.split(",") if label.strip()}
    expr = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"(?<![A-Za-z_])[0-9]+(ms|s|m|h|d|w|y)\b", "", expr)  # offset durations
    expr = re.sub(r"(?<![A-Za-z_])[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?", "", expr)  # numbers
    names = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr)) - PROMQL_WORDS
    return names, labels


def test_promql_references() -> None:
    expr = (
        'sum by (le, method) (rate(kvpool_x_bucket{namespace=~"$ns"}[5m] offset 1h))'
        " / 1e-9 + histogram_quantile(0.99, kvpool_y) * on (pod) bogus_metric"
    )
    names, labels = promql_references(expr)
    assert names == {"kvpool_x_bucket", "kvpool_y", "bogus_metric"}
    assert labels == {"le", "method", "namespace", "pod"}


def dashboard_references(dashboard: dict[str, Any]) -> tuple[set[str], set[str]]:
    names: set[str] = set()
    labels: set[str] = set()
    panels = list(dashboard["panels"])
    while panels:
        panel = panels.pop()
        panels += panel.get("panels", [])
        for target in panel.get("targets", []):
            found_names, found_labels = promql_references(target["expr"])
            names |= found_names
            labels |= found_labels
    for variable in dashboard["templating"]["list"]:
        query = variable.get("definition") or ""
        for metric, label in re.findall(r"label_values\(\s*(\w+)\s*,\s*(\w+)\s*\)", query):
            names.add(metric)
            labels.add(label)
    return names, labels


@pytest.fixture(scope="module")
def exported() -> tuple[set[str], set[str]]:
    """Every series name (with its _total/_bucket/... suffixes) and label the code exports."""
    from prometheus_client import REGISTRY
    from prometheus_client.metrics import MetricWrapperBase

    from kvpool.master import metrics as master_metrics
    from kvpool.master.records import SegmentInfo
    from kvpool.master.state import MasterState
    from kvpool.storage_node import metrics as node_metrics

    state = MasterState(clock=lambda: 0.0)
    state.mount_segment(SegmentInfo("n1/dram-1", "n1", "host-1", b"w", 0, 1 << 20, b"k"))
    saved = (master_metrics.STATE.snapshot, master_metrics.STATE.counters)
    master_metrics.STATE.publish(state.snapshot(), state.counters)
    try:
        families = list(REGISTRY.collect())
    finally:
        master_metrics.STATE.snapshot, master_metrics.STATE.counters = saved

    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "summary": ("", "_sum", "_count", "_created"),
        "gauge": ("",),
        "info": ("_info",),
    }
    names: set[str] = set()
    labels: set[str] = set()
    for family in families:
        names |= {family.name + suffix for suffix in suffixes.get(family.type, ("",))}
        for sample in family.samples:
            names.add(sample.name)
            labels |= set(sample.labels)
        if family.type == "histogram":
            labels.add("le")
    for module in (master_metrics, node_metrics):
        for metric in vars(module).values():
            if isinstance(metric, MetricWrapperBase):
                labels |= set(metric._labelnames)  # labelled series exist once observed
    return names, labels


def test_exported_names_are_found(exported: tuple[set[str], set[str]]) -> None:
    names, labels = exported
    for name in (
        "kvpool_master_requests_total",
        "kvpool_master_request_seconds_bucket",
        "kvpool_nodes",
        "kvpool_hits_total",
        "kvpool_node_heartbeats_total",
    ):
        assert name in names
    assert {"method", "status", "segment", "node", "tier", "le"} <= labels


def test_dashboard_uses_only_exported_metrics(
    renders: dict[str, Render], exported: tuple[set[str], set[str]]
) -> None:
    render = renders["ha-bundled-etcd"]
    (configmap,) = render.of_kind("ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(configmap["data"]["kvpool.json"])
    used_names, used_labels = dashboard_references(dashboard)
    names, labels = exported
    assert used_names, "the dashboard queries no metric"
    assert any(n.startswith("kvpool_master_") for n in used_names)
    assert any(n.startswith("kvpool_node_") for n in used_names)
    assert used_names <= names, f"not exported by the code: {sorted(used_names - names)}"
    unknown_labels = used_labels - labels - TARGET_LABELS
    assert not unknown_labels, f"labels nothing exports: {sorted(unknown_labels)}"


def test_dashboard_file_is_what_the_configmap_ships(renders: dict[str, Render]) -> None:
    (configmap,) = renders["ha-bundled-etcd"].of_kind("ConfigMap")
    shipped = json.loads((CHART_DIR / "dashboards" / "kvpool.json").read_text())
    assert json.loads(configmap["data"]["kvpool.json"]) == shipped
    assert len({p["id"] for p in shipped["panels"]}) == len(shipped["panels"])


def test_service_monitor_scrapes_master_and_nodes(renders: dict[str, Render]) -> None:
    """ServiceMonitor is a CRD, outside Kubernetes' OpenAPI schemas: check what it selects."""
    render = renders["ha-bundled-etcd"]
    (monitor,) = render.of_kind("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"matchNames": [render.namespace]}
    assert spec["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "kvpool",
        "app.kubernetes.io/instance": render.release,
    }
    (expression,) = spec["selector"]["matchExpressions"]
    assert expression["key"] == "app.kubernetes.io/component"
    assert expression["operator"] == "In"
    scraped = _scraped_services(render)
    assert scraped == {f"{render.fullname}-master", f"{render.fullname}-node"}
    (endpoint,) = spec["endpoints"]
    assert endpoint["path"] == "/metrics"
    for service in render.of_kind("Service"):
        if service["metadata"]["name"] in scraped:
            assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert re.fullmatch(r"([0-9]+(ms|s|m|h))+", endpoint["interval"])


def _scraped_services(render: Render) -> set[str]:
    """The Services the ServiceMonitor scrapes: those it selects that have its port."""
    (monitor,) = render.of_kind("ServiceMonitor")
    spec = monitor["spec"]
    (endpoint,) = spec["endpoints"]
    scraped = set()
    for service in render.of_kind("Service"):
        labels = service["metadata"]["labels"]
        if _selects(spec["selector"], labels) and endpoint["port"] in {
            p["name"] for p in service["spec"]["ports"]
        }:
            scraped.add(service["metadata"]["name"])
    return scraped


def test_service_monitor_names_only_exported_metrics(
    renders: dict[str, Render], exported: tuple[set[str], set[str]]
) -> None:
    (monitor,) = renders["ha-bundled-etcd"].of_kind("ServiceMonitor")
    used = set(re.findall(r"\bkvpool_[a-z0-9_]+", yaml.safe_dump(monitor)))
    assert used <= exported[0], sorted(used - exported[0])


# --------------------------------------------------------------------------- alerts


def _alert_rules(render: Render) -> list[dict[str, Any]]:
    (rule,) = render.of_kind("PrometheusRule")
    (group,) = rule["spec"]["groups"]
    return list(group["rules"])


def _selectors(expr: str) -> list[Any]:
    """The vector selectors of an expression, parsed as Prometheus parses it."""
    import promql_parser

    found: list[Any] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)

    promql_parser.walk(promql_parser.parse(expr), pre_visit=visit)
    return found


def test_alerts_parse_and_name_only_exported_series_of_this_release(
    renders: dict[str, Render], exported: tuple[set[str], set[str]]
) -> None:
    """Each alert's expression is valid PromQL, asks only for series the code exports, and
    only for this release's: the namespace, and the Services the ServiceMonitor scrapes."""
    render = renders["ha-bundled-etcd"]
    (rule,) = render.of_kind("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    names, labels = exported
    scraped = _scraped_services(render)
    for alert in _alert_rules(render):
        selectors = _selectors(alert["expr"])
        assert selectors, alert["alert"]
        for selector in selectors:
            assert selector.name in names, (alert["alert"], selector.name)
            matchers = {m.name: m for m in selector.matchers.matchers}
            assert matchers["namespace"].value == render.namespace, alert["alert"]
            service = matchers["service"]
            assert str(service.op) == "MatchOp.Re", alert["alert"]
            assert all(re.fullmatch(service.value, s) for s in scraped), alert["alert"]
        used_names, used_labels = promql_references(alert["expr"])
        assert used_names <= names, alert["alert"]
        assert used_labels - labels - TARGET_LABELS == set(), alert["alert"]


def test_every_alert_says_how_bad_it_is_and_what_to_do(renders: dict[str, Render]) -> None:
    render = renders["ha-bundled-etcd"]
    alerts = _alert_rules(render)
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    rule_values = schema["properties"]["monitoring"]["properties"]["prometheusRule"]
    # (every alert may be left out by name, and the schema names no other)
    assert [a["alert"] for a in alerts] == rule_values["properties"]["disabled"]["items"]["enum"]
    for alert in alerts:
        assert alert["labels"]["severity"] in {"critical", "warning"}, alert["alert"]
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
        assert re.fullmatch(r"[0-9]+[smh]", alert.get("for", "0s")), alert["alert"]
    # Prometheus's own templates reach it whole (not expanded by Helm)
    reach = {a["alert"]: a for a in alerts}["KvpoolStorageNodeCannotReachMaster"]
    assert "{{ $labels.pod }}" in reach["annotations"]["description"]


def test_alerts_never_read_a_release_named_after_this_one(
    render_as: Callable[[dict[str, Any], str, str], Render],
) -> None:
    """Releases "kvpool" and "kvpool-canary" in one namespace: each release's alerts read its
    own Services only (a prefix match once summed both releases' leaders: a critical alert
    for two healthy clusters, and one cluster's outage hidden by the other)."""
    values = {
        "monitoring": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}
    }
    releases = {name: render_as(values, name, "shared") for name in ("kvpool", "kvpool-canary")}
    services = {name: _scraped_services(r) for name, r in releases.items()}
    assert services["kvpool"] and services["kvpool-canary"]
    for name, render in releases.items():
        (other,) = set(releases) - {name}
        for alert in _alert_rules(render):
            for selector in _selectors(alert["expr"]):
                matchers = {m.name: m.value for m in selector.matchers.matchers}
                assert all(re.fullmatch(matchers["service"], s) for s in services[name])
                assert not any(re.fullmatch(matchers["service"], s) for s in services[other])


def test_alerts_without_the_service_monitor_are_refused(render: Renderer) -> None:
    values = {"monitoring": {"prometheusRule": {"enabled": True}}}
    assert "needs monitoring.serviceMonitor.enabled" in rejected(render, values)


def test_alerts_are_off_by_default_and_each_may_be_left_out(
    renders: dict[str, Render], render_release: Callable[[dict[str, Any]], Render]
) -> None:
    assert not renders["default"].of_kind("PrometheusRule")
    values = {
        "monitoring": {
            "serviceMonitor": {"enabled": True},
            "prometheusRule": {
                "enabled": True,
                "disabled": ["KvpoolCallersRefused", "KvpoolDiskAlmostFull"],
                "diskFreeBytesBelow": 5 << 30,
            },
        }
    }
    alerts = {a["alert"]: a for a in _alert_rules(render_release(values))}
    assert "KvpoolCallersRefused" not in alerts and "KvpoolDiskAlmostFull" not in alerts
    assert "KvpoolNoLeadingMaster" in alerts
    values["monitoring"]["prometheusRule"]["disabled"] = []
    alerts = {a["alert"]: a for a in _alert_rules(render_release(values))}
    assert alerts["KvpoolDiskAlmostFull"]["expr"].endswith(f"< {5 << 30}")


# --------------------------------------------------------------------------- the image


def test_image_matches_the_chart() -> None:
    """The Dockerfile builds what the chart runs: the kvpool entry point as the chart's UID."""
    dockerfile = (REPO / "Dockerfile").read_text()
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim$", dockerfile, re.M)
    assert re.search(r"^RUN pip install \.", dockerfile, re.M)
    assert 'ENTRYPOINT ["kvpool"]' in dockerfile
    uid = values["securityContext"]["runAsUser"]
    assert re.search(rf"^USER {uid}:{values['securityContext']['runAsGroup']}$", dockerfile, re.M)
    pyproject = (REPO / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1)
    assert chart["appVersion"] == version  # the default image tag
    assert chart["apiVersion"] == "v2"


# --------------------------------------------------------------------------- security


def _pod(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def _workload(render: Render, component: str) -> dict[str, Any]:
    (found,) = [
        w
        for w in render.workloads()
        if w["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return found


def _flags(args: list[str]) -> dict[str, str]:
    """``--name=value`` arguments as a dict (valueless flags map to "")."""
    found = {}
    for arg in args:
        if arg.startswith("--"):
            name, _, value = arg.partition("=")
            found[name] = value
    return found


def _secret_files(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Path in the container -> (Secret, key) for every file of a mounted Secret volume whose
    keys are listed; a whole-Secret mount maps its directory to (Secret, "*")."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    files = {}
    for mount in container.get("volumeMounts", []):
        secret = volumes.get(mount["name"], {}).get("secret")
        if secret is None:
            continue
        if "items" in secret:
            for item in secret["items"]:
                files[f"{mount['mountPath']}/{item['path']}"] = (secret["secretName"], item["key"])
        else:
            files[mount["mountPath"]] = (secret["secretName"], "*")
    return files


def _file_source(files: dict[str, tuple[str, str]], path: str) -> tuple[str, str] | None:
    """The (Secret, key) a path in the container reads, or None when no Secret provides it."""
    if path in files:
        return files[path]
    directory, _, name = path.rpartition("/")
    secret, key = files.get(directory, (None, None))
    return (secret, name) if key == "*" else None


PATH_FLAGS = (
    "--quotas",
    "--capability-key-file",
    "--tls-cert",
    "--tls-key",
    "--tls-client-ca",
    "--tls-ca",
    "--credentials",
    "--etcd-ca",
    "--etcd-cert",
    "--etcd-key",
)


def test_default_values_are_secure(renders: dict[str, Render]) -> None:
    render = renders["default"]
    master = _flags(render.container("master")["args"])
    assert master["--tls-cert"] == "/etc/kvpool/tls/tls.crt"
    assert master["--tls-key"] == "/etc/kvpool/tls/tls.key"
    assert master["--tls-client-ca"] == "/etc/kvpool/tls/ca.crt"
    assert master["--credentials"] == "/etc/kvpool/credentials/credentials.json"
    assert "--insecure" not in master and "--require-client-cert" not in master
    node_container = render.container("node")
    node = _flags(node_container["args"])
    assert node["--tls-ca"] == "/etc/kvpool/tls/ca.crt"
    assert node["--node-id"] == "$(K8S_NODE_NAME)"  # a DaemonSet: the Kubernetes node's name
    assert "--insecure" not in node and "--tls-cert" not in node
    env = {e["name"]: e.get("value") for e in node_container["env"]}
    assert env["KVPOOL_TOKEN_FILE"] == "/etc/kvpool/node-tokens/$(K8S_NODE_NAME)"
    master_files = _secret_files(_pod(_workload(render, "master")), render.container("master"))
    assert master_files["/etc/kvpool/tls"] == ("kvpool-tls", "*")
    assert master_files["/etc/kvpool/credentials/credentials.json"] == (
        "kvpool-credentials",
        "credentials.json",
    )
    node_files = _secret_files(_pod(_workload(render, "node")), node_container)
    # The nodes get the CA of the master's Secret, never its key.
    assert node_files["/etc/kvpool/tls/ca.crt"] == ("kvpool-tls", "ca.crt")
    assert not [f for f in node_files.values() if f[1] in ("tls.key", "*") and f[0] == "kvpool-tls"]
    assert node_files["/etc/kvpool/node-tokens"] == ("kvpool-node-tokens", "*")
    kinds = {o["kind"] for o in render.objects}
    assert "NetworkPolicy" in kinds and "Certificate" not in kinds


def test_statefulset_nodes_read_the_token_of_their_pod_name(renders: dict[str, Render]) -> None:
    render = renders["single-master"]
    container = render.container("node")
    assert _flags(container["args"])["--node-id"] == "$(POD_NAME)"
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["KVPOOL_TOKEN_FILE"]["value"] == "/etc/kvpool/node-tokens/$(POD_NAME)"
    names = [e["name"] for e in container["env"]]
    assert names.index("POD_NAME") < names.index("KVPOOL_TOKEN_FILE")  # defined before use


def test_secret_files_named_by_flags_are_mounted(
    renders: dict[str, Render], value_set: str
) -> None:
    """Every file a security flag names is a key of a Secret mounted in that container."""
    render = renders[value_set]
    for component in ("master", "node"):
        container = render.container(component)
        files = _secret_files(_pod(_workload(render, component)), container)
        for name, value in _flags(container["args"]).items():
            if name in PATH_FLAGS:
                assert _file_source(files, value), f"{component} {name}={value} is not mounted"
        for env in container.get("env", []):
            if env["name"] == "KVPOOL_TOKEN_FILE":
                directory = env["value"].rpartition("/")[0]
                assert files[directory][1] == "*"


def test_secrets_are_never_mounted_with_subpath(renders: dict[str, Render], value_set: str) -> None:
    """A subPath mount is a copy made at start: rotated certificates and tokens never reach it."""
    for workload in renders[value_set].workloads():
        pod = _pod(workload)
        secrets = {v["name"] for v in pod.get("volumes", []) if "secret" in v}
        for container in pod["containers"]:
            for mount in container.get("volumeMounts", []):
                if mount["name"] in secrets:
                    assert "subPath" not in mount and "subPathExpr" not in mount
                    assert mount.get("readOnly") is True


def test_insecure_cluster(renders: dict[str, Render]) -> None:
    render = renders["insecure-dev"]
    for component in ("master", "node"):
        args = render.container(component)["args"]
        assert "--insecure" in args
        assert not [a for a in args if a.split("=")[0] in PATH_FLAGS]
    master = _flags(render.container("master")["args"])
    assert master["--etcd"].startswith("http://")
    assert _flags(render.container("node")["args"])["--master"].startswith("etcd://")
    assert "--node-id" not in _flags(render.container("node")["args"])
    for workload in render.workloads():
        assert not [v for v in _pod(workload).get("volumes", []) if "secret" in v]
    (etcd,) = _pod(_workload(render, "etcd"))["containers"]
    assert not [a for a in etcd["args"] if "https" in a or "cert" in a]
    assert "INSECURE" in render.notes


def test_cert_manager_certificates(renders: dict[str, Render]) -> None:
    render = renders["cert-manager-mtls"]
    name, ns = render.fullname, render.namespace
    certificates = {c["metadata"]["name"]: c for c in render.of_kind("Certificate")}
    assert set(certificates) == {
        f"{name}-master",
        f"{name}-node-client",
        f"{name}-etcd",
        f"{name}-etcd-client",
    }
    for certificate in certificates.values():
        assert certificate["apiVersion"] == "cert-manager.io/v1"
        spec = certificate["spec"]
        assert spec["issuerRef"] == {
            "name": "kvpool-ca",
            "kind": "ClusterIssuer",
            "group": "cert-manager.io",
        }
        assert spec["privateKey"]["rotationPolicy"] == "Always"
    master_cert = certificates[f"{name}-master"]["spec"]
    service = f"{name}-master"
    assert master_cert["dnsNames"] == [
        service,
        f"{service}.{ns}",
        f"{service}.{ns}.svc",
        f"{service}.{ns}.svc.cluster.local",
        # several masters: every master pod, as each advertises itself when it leads
        f"*.{name}-master-headless.{ns}.svc",
        f"*.{name}-master-headless.{ns}.svc.cluster.local",
        "kvpool.example.com",
    ]
    assert "server auth" in master_cert["usages"]
    assert render.master_address.rpartition(":")[0] in master_cert["dnsNames"]
    # The Secrets cert-manager writes are the ones the pods mount.
    master_files = _secret_files(_pod(_workload(render, "master")), render.container("master"))
    assert master_files["/etc/kvpool/tls"] == (master_cert["secretName"], "*")
    etcd_client = certificates[f"{name}-etcd-client"]["spec"]
    assert master_files["/etc/kvpool/etcd-tls"] == (etcd_client["secretName"], "*")
    assert etcd_client["usages"][-1] == "client auth"
    node_files = _secret_files(_pod(_workload(render, "node")), render.container("node"))
    node_client = certificates[f"{name}-node-client"]["spec"]
    assert node_files["/etc/kvpool/client-tls/tls.crt"] == (node_client["secretName"], "tls.crt")
    assert node_files["/etc/kvpool/tls/ca.crt"] == (master_cert["secretName"], "ca.crt")
    assert node_client["usages"] == ["digital signature", "key encipherment", "client auth"]
    etcd_cert = certificates[f"{name}-etcd"]["spec"]
    headless = f"{name}-etcd-headless.{ns}.svc"
    assert f"*.{headless}" in etcd_cert["dnsNames"]
    assert {"server auth", "client auth"} <= set(etcd_cert["usages"])
    etcd_pod = _pod(_workload(render, "etcd"))
    etcd_secrets = {v["secret"]["secretName"] for v in etcd_pod["volumes"] if "secret" in v}
    assert etcd_secrets == {etcd_cert["secretName"]}
    # Mutual TLS: the master requires client certificates, the nodes present one.
    assert "--require-client-cert" in render.container("master")["args"]
    node = _flags(render.container("node")["args"])
    assert node["--tls-cert"] == "/etc/kvpool/client-tls/tls.crt"
    assert node["--tls-key"] == "/etc/kvpool/client-tls/tls.key"
    assert node["--node-id"] == "$(POD_NAME)"
    # Elected masters behind TLS: the nodes dial the Service the certificate names.
    assert node["--master"] == render.master_address


def test_cert_manager_only_for_the_master(render: Renderer) -> None:
    values = {"tls": {"certManager": {"enabled": True, "issuerRef": {"name": "ca"}}}}
    objects = [d for p, t in render(values).items() if p.endswith(".yaml") for d in _docs(t)]
    (certificate,) = [o for o in objects if o["kind"] == "Certificate"]
    assert certificate["spec"]["secretName"] == "kv-kvpool-tls"
    assert certificate["spec"]["issuerRef"] == {
        "name": "ca",
        "kind": "Issuer",
        "group": "cert-manager.io",
    }


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def test_bundled_etcd_serves_tls_with_client_certificates(renders: dict[str, Render]) -> None:
    render = renders["ha-bundled-etcd"]
    (etcd,) = _pod(_workload(render, "etcd"))["containers"]
    args = _flags(etcd["args"])
    tls_dir = "/etc/etcd/tls"
    assert args["--listen-client-urls"] == "https://0.0.0.0:2379"
    assert args["--listen-peer-urls"] == "https://0.0.0.0:2380"
    assert args["--advertise-client-urls"].startswith("https://$(POD_NAME).")
    assert args["--initial-advertise-peer-urls"].startswith("https://$(POD_NAME).")
    assert all("=https://" in m for m in args["--initial-cluster"].split(","))
    assert args["--listen-metrics-urls"] == "http://0.0.0.0:2381"  # probes and Prometheus
    for prefix in ("", "peer-"):
        assert args[f"--{prefix}cert-file"] == f"{tls_dir}/tls.crt"
        assert args[f"--{prefix}key-file"] == f"{tls_dir}/tls.key"
        assert args[f"--{prefix}trusted-ca-file"] == f"{tls_dir}/ca.crt"
        assert args[f"--{prefix}client-cert-auth"] == ""
    files = _secret_files(_pod(_workload(render, "etcd")), etcd)
    assert files[tls_dir] == ("kvpool-etcd-tls", "*")
    master = _flags(render.container("master")["args"])
    assert all(e.startswith("https://") for e in master["--etcd"].split(","))
    assert master["--etcd-ca"] == "/etc/kvpool/etcd-tls/ca.crt"
    assert master["--etcd-cert"] == "/etc/kvpool/etcd-tls/tls.crt"
    assert master["--etcd-key"] == "/etc/kvpool/etcd-tls/tls.key"
    master_files = _secret_files(_pod(_workload(render, "master")), render.container("master"))
    assert master_files["/etc/kvpool/etcd-tls"] == ("kvpool-etcd-tls", "*")


def test_external_etcd_over_tls(renders: dict[str, Render]) -> None:
    render = renders["external-etcd"]
    master = _flags(render.container("master")["args"])
    assert master["--etcd"] == ",".join(render.values["etcd"]["external"]["endpoints"])
    assert master["--etcd-cert"] == "/etc/kvpool/etcd-tls/tls.crt"
    files = _secret_files(_pod(_workload(render, "master")), render.container("master"))
    assert files["/etc/kvpool/etcd-tls"] == ("etcd-client-tls", "*")
    assert not [o for o in render.objects if "etcd" in o["metadata"]["name"]]


def test_master_accepts_its_rendered_security_flags(
    renders: dict[str, Render], value_set: str, tmp_path: Path
) -> None:
    """The rendered security flags pass the master's own checks (security_from_args), with
    real files where the pod mounts its Secrets: a throwaway CA and a credentials file made
    by `kvpool token create`."""
    from kvpool.cli.main import main as kvpool_main
    from kvpool.master.security_config import security_from_args
    from kvpool.security.dev_pki import make_dev_pki

    render = renders[value_set]
    root = tmp_path / "root"
    pki = make_dev_pki(tmp_path / "pki", hosts=["kv-kvpool-master.cache.svc"])
    for directory in ("etc/kvpool/tls", "etc/kvpool/etcd-tls"):
        (root / directory).mkdir(parents=True)
        (root / directory / "tls.crt").write_bytes(pki.server_cert.read_bytes())
        (root / directory / "tls.key").write_bytes(pki.server_key.read_bytes())
        (root / directory / "ca.crt").write_bytes(pki.ca.read_bytes())
    credentials = root / "etc/kvpool/credentials/credentials.json"
    credentials.parent.mkdir(parents=True)
    with contextlib.redirect_stdout(io.StringIO()):
        kvpool_main(
            ["token", "create", "--credentials", str(credentials), "--name", "a", "--role", "admin"]
        )
    argv = [
        f"{a.split('=')[0]}={root}{a.split('=', 1)[1]}" if "=/etc/kvpool/" in a else a
        for a in container_argv(render.container("master"))
    ]
    security = security_from_args(parse_cli(argv))
    assert security.secure is not render.values["auth"]["insecure"]
    assert (security.grpc_credentials is None) is render.values["auth"]["insecure"]
    assert (security.etcd_tls is not None) is (
        render.values["master"]["replicas"] > 1 and not render.values["auth"]["insecure"]
    )


# -- refusals


def test_refuses_insecure_load_balancer(render: Renderer) -> None:
    values = {"auth": {"insecure": True}, "master": {"service": {"type": "LoadBalancer"}}}
    message = rejected(render, values)
    assert "auth.insecure is true and master.service.type is LoadBalancer" in message
    assert "auth.allowInsecureExposure=true" in message


def test_refuses_insecure_node_port(render: Renderer) -> None:
    values = {"auth": {"insecure": True}, "master": {"service": {"type": "NodePort"}}}
    assert "master.service.type is NodePort" in rejected(render, values)


def test_insecure_exposure_when_asked_for(render: Renderer) -> None:
    values = {
        "auth": {"insecure": True, "allowInsecureExposure": True},
        "master": {"service": {"type": "LoadBalancer"}},
    }
    master = yaml.safe_load(render(values)["kvpool/templates/master-deployment.yaml"])
    assert "--insecure" in master["spec"]["template"]["spec"]["containers"][0]["args"]


def test_secure_load_balancer_renders(render: Renderer) -> None:
    render({"master": {"service": {"type": "LoadBalancer"}}})


def test_refuses_missing_credentials(render: Renderer) -> None:
    message = rejected(render, {"auth": {"credentialsSecret": ""}})
    assert "auth.credentialsSecret is empty" in message
    assert "kvpool token create --credentials" in message and "auth.insecure=true" in message


def test_refuses_missing_node_tokens(render: Renderer) -> None:
    message = rejected(render, {"auth": {"nodeTokens": {"existingSecret": ""}}})
    assert "auth.nodeTokens.existingSecret is empty" in message


def test_refuses_tls_off_unless_insecure(render: Renderer) -> None:
    message = rejected(render, {"tls": {"enabled": False}})
    assert "tls.enabled is false but auth.insecure is not set" in message
    render({"tls": {"enabled": False}, "auth": {"insecure": True}})


def test_refuses_missing_tls_secret(render: Renderer) -> None:
    message = rejected(render, {"tls": {"existingSecret": ""}})
    assert "tls.existingSecret is empty" in message and "tls.certManager.enabled" in message


def test_refuses_cert_manager_without_issuer(render: Renderer) -> None:
    message = rejected(render, {"tls": {"certManager": {"enabled": True}}})
    assert "tls.certManager.issuerRef.name is empty" in message


def test_refuses_mutual_tls_without_a_node_certificate(render: Renderer) -> None:
    message = rejected(render, {"tls": {"requireClientCert": True}})
    assert "tls.requireClientCert is true but the storage nodes have no client" in message
    files = render({"tls": {"requireClientCert": True, "nodeClientSecret": "node-client"}})
    node = yaml.safe_load(files["kvpool/templates/node-workload.yaml"])
    volumes = {v["name"]: v for v in node["spec"]["template"]["spec"]["volumes"]}
    assert volumes["client-tls"]["secret"]["secretName"] == "node-client"


def test_refuses_plaintext_external_etcd(render: Renderer) -> None:
    etcd = {"mode": "external", "external": {"endpoints": ["http://etcd:2379"]}}
    message = rejected(render, {"master": {"replicas": 2}, "etcd": etcd})
    assert "etcd.external.endpoints lists http://etcd:2379, a plaintext URL" in message
    render({"master": {"replicas": 2}, "etcd": etcd, "auth": {"insecure": True}})


def test_refuses_bundled_etcd_without_certificates(render: Renderer) -> None:
    values = {"master": {"replicas": 3}, "etcd": {"tls": {"existingSecret": ""}}}
    assert "etcd.tls.existingSecret is empty" in rejected(render, values)


def test_refuses_bad_ucx_port_range(render: Renderer) -> None:
    message = rejected(render, {"storage": {"ucxTcpPortRange": "5000-4000"}})
    assert 'storage.ucxTcpPortRange "5000-4000" is not a range of ports' in message


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"tls": {"enable": True}}, "at '/tls': additional properties 'enable' not allowed"),
        ({"tls": {"enabled": "yes"}}, "at '/tls/enabled'"),
        ({"tls": {"certManager": {"issuerRef": {"kind": "Foo"}}}}, "/tls/certManager/issuerRef"),
        ({"tls": {"certManager": {"duration": "90 days"}}}, "at '/tls/certManager/duration'"),
        ({"tls": {"existingSecret": "Bad_Name"}}, "at '/tls/existingSecret'"),
        ({"auth": {"insecure": "true"}}, "at '/auth/insecure'"),
        ({"auth": {"tokens": "x"}}, "additional properties 'tokens' not allowed"),
        ({"auth": {"nodeTokens": {"secret": "x"}}}, "at '/auth/nodeTokens'"),
        ({"etcd": {"tls": {"caFile": "x"}}}, "at '/etcd/tls'"),
        ({"networkPolicy": {"enabled": 1}}, "at '/networkPolicy/enabled'"),
        ({"networkPolicy": {"metricsFrom": [{"pods": {}}]}}, "at '/networkPolicy/metricsFrom/0'"),
        ({"networkPolicy": {"metricsFrom": [{}]}}, "at '/networkPolicy/metricsFrom/0'"),
        (
            {"networkPolicy": {"clientPodSelector": {"matchLabels": {"a": 1}}}},
            "at '/networkPolicy/clientPodSelector/matchLabels/a'",
        ),
        ({"storage": {"ucxTcpPortRange": "40000"}}, "at '/storage/ucxTcpPortRange'"),
        ({"storage": {"tenant": "Team A"}}, "at '/storage/tenant'"),
        ({"master": {"sameHostClients": "alice"}}, "at '/master/sameHostClients'"),
        ({"master": {"sameHostClients": ["a b"]}}, "at '/master/sameHostClients/0'"),
    ],
)
def test_schema_rejects_bad_security_values(
    render: Renderer, values: dict[str, Any], where: str
) -> None:
    assert where in rejected(render, values)


# -- NetworkPolicy


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a LabelSelector matches labels (matchLabels and matchExpressions)."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values")
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and labels.get(key) in values:
            return False
    return True


def _admits(
    policy: dict[str, Any],
    labels: dict[str, str],
    port: int,
    namespace: str,
    namespace_labels: dict[str, str] | None = None,
) -> bool:
    """Whether ``policy`` admits TCP to ``port`` from a pod (Kubernetes' semantics for pod and
    namespace selectors; IP blocks are not evaluated)."""
    namespace_labels = {"kubernetes.io/metadata.name": namespace, **(namespace_labels or {})}
    for rule in policy["spec"].get("ingress", []):
        ports = rule.get("ports")
        port_ok = ports is None or any(
            p.get("protocol", "TCP") == "TCP"
            and (
                "port" not in p or p["port"] <= port <= p.get("endPort", p["port"])
                if isinstance(p.get("port", 0), int)
                else False
            )
            for p in ports
        )
        if not port_ok:
            continue
        for peer in rule.get("from", []):
            if "ipBlock" in peer:
                continue
            if "namespaceSelector" in peer:
                namespace_ok = _selects(peer["namespaceSelector"], namespace_labels)
            else:
                namespace_ok = namespace == policy["metadata"]["namespace"]
            pod_ok = _selects(peer.get("podSelector", {}), labels)
            if namespace_ok and pod_ok:
                return True
    return False


def _chart_pod(render: Render, component: str) -> dict[str, str]:
    return _workload(render, component)["spec"]["template"]["metadata"]["labels"]


def test_network_policies_select_the_chart_pods(renders: dict[str, Render], value_set: str) -> None:
    render = renders[value_set]
    policies = {p["metadata"]["name"]: p for p in render.of_kind("NetworkPolicy")}
    for workload in render.workloads():
        labels = workload["spec"]["template"]["metadata"]["labels"]
        selecting = [p for p in policies.values() if _selects(p["spec"]["podSelector"], labels)]
        assert len(selecting) == 1, workload["metadata"]["name"]
        assert selecting[0]["spec"]["policyTypes"] == ["Ingress"]


def test_network_policy_admits_chart_pods_and_clients_only(renders: dict[str, Render]) -> None:
    render = renders["default"]
    ns = render.namespace
    master = render.get("NetworkPolicy", f"{render.fullname}-master")
    node = render.get("NetworkPolicy", f"{render.fullname}-node")
    client = {"app": "vllm", "kvpool.io/client": "true"}
    stranger = {"app": "vllm"}
    for port in (50051, 50052):
        assert _admits(master, _chart_pod(render, "node"), port, ns)
        assert _admits(master, client, port, ns)
        assert not _admits(master, stranger, port, ns)
        assert not _admits(master, client, port, "elsewhere")  # clients of this namespace only
    assert not _admits(master, client, 22, ns)
    # The checked stream only: the nodes offer no UCX over TCP.
    assert _admits(node, client, 9092, ns)
    assert _admits(node, _chart_pod(render, "node"), 9092, ns)
    assert not _admits(node, stranger, 9092, ns)
    for port in (34567, 60999):
        assert not _admits(node, client, port, ns)
    # The HTTP ports (a master's /metrics names tenants and what each holds): the release's
    # pods, not the clients (nor anyone else without networkPolicy.metricsFrom).
    for policy, port in ((master, 9090), (node, 9091)):
        assert _admits(policy, _chart_pod(render, "node"), port, ns)
        assert _admits(policy, _chart_pod(render, "master"), port, ns)
        assert not _admits(policy, client, port, ns)
        assert not _admits(policy, stranger, port, ns)
    assert "--ucx-tcp" not in render.container("node")["args"]
    # Another release's pods are not this release's.
    other = {**_chart_pod(render, "node"), "app.kubernetes.io/instance": "other"}
    assert not _admits(master, other, 50051, ns)


def test_ucx_over_tcp_is_opted_into_and_then_admitted_on_every_port(
    render_release: Callable[[dict[str, Any]], Render],
) -> None:
    """UCX takes ephemeral ports: with it on TCP, clients reach every TCP port of the nodes."""
    on_tcp = render_release({"storage": {"ucxTcp": True}})
    node = on_tcp.get("NetworkPolicy", f"{on_tcp.fullname}-node")
    assert "--ucx-tcp" in on_tcp.container("node")["args"]
    client = {"app": "vllm", "kvpool.io/client": "true"}
    for port in (9091, 9092, 34567, 60999):
        assert _admits(node, client, port, on_tcp.namespace)


def test_same_host_mapping_is_opted_into_per_identity_and_for_one_tenant_s_nodes(
    render_release: Callable[[dict[str, Any]], Render],
) -> None:
    default = render_release({})
    assert not any(a.startswith("--same-host-clients") for a in default.container("master")["args"])
    assert not any(a.startswith("--tenant") for a in default.container("node")["args"])
    opted = render_release(
        {"master": {"sameHostClients": ["vllm-a", "sglang-a"]}, "storage": {"tenant": "team-a"}}
    )
    assert "--same-host-clients=vllm-a,sglang-a" in opted.container("master")["args"]
    assert "--tenant=team-a" in opted.container("node")["args"]


def test_network_policy_with_a_ucx_port_range_and_metrics_peers(
    renders: dict[str, Render],
) -> None:
    render = renders["cert-manager-mtls"]
    ns = render.namespace
    master = render.get("NetworkPolicy", f"{render.fullname}-master")
    node = render.get("NetworkPolicy", f"{render.fullname}-node")
    etcd = render.get("NetworkPolicy", f"{render.fullname}-etcd")
    env = {e["name"]: e.get("value") for e in render.container("node")["env"]}
    assert env["UCX_TCP_PORT_RANGE"] == "40000-40099"
    client = {"kvpool.io/client": "true"}
    clients_ns = {"kvpool.io/clients": "true"}
    assert _admits(node, client, 40000, "team-a", clients_ns)
    assert _admits(node, client, 40099, "team-a", clients_ns)
    assert not _admits(node, client, 9091, "team-a", clients_ns)  # (/metrics)
    assert _admits(node, client, 9092, "team-a", clients_ns)  # the checked stream
    assert not _admits(node, client, 40100, "team-a", clients_ns)
    assert not _admits(node, client, 40000, "team-b")  # namespace not labelled
    assert not _admits(node, client, 40000, ns)  # the selector names the client namespaces
    assert _admits(master, client, 50051, "team-a", clients_ns)
    assert not _admits(master, client, 9090, "team-a", clients_ns)
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    assert _admits(master, prometheus, 9090, "monitoring")
    assert not _admits(master, prometheus, 50051, "monitoring")
    assert _admits(node, prometheus, 9091, "monitoring")
    assert not _admits(node, prometheus, 40000, "monitoring")
    assert _admits(etcd, prometheus, 2381, "monitoring")
    # etcd: clients are the release's pods (the masters), peers the members.
    assert _admits(etcd, _chart_pod(render, "master"), 2379, ns)
    assert not _admits(etcd, client, 2379, "team-a", clients_ns)
    assert _admits(etcd, _chart_pod(render, "etcd"), 2380, ns)
    assert not _admits(etcd, _chart_pod(render, "master"), 2380, ns)


def test_nodes_serve_the_checked_stream_on_a_pinned_port_at_the_pod_address(
    renders: dict[str, Render],
) -> None:
    container = renders["default"].container("node")
    assert "--data-port=9092" in container["args"]
    assert "--data-advertise=$(POD_IP)" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["data"] == 9092


def test_network_policy_can_be_turned_off(render: Renderer) -> None:
    files = render({"networkPolicy": {"enabled": False}})
    assert not files.get("kvpool/templates/networkpolicy.yaml", "").strip()


def test_node_accepts_its_rendered_security_flags(
    renders: dict[str, Render], value_set: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rendered node command line and token file pass the node's own checks
    (credentials_from_args), with real files where the pod mounts its Secrets."""
    from kvpool.cli.main import main as kvpool_main
    from kvpool.common.master_address import parse_master
    from kvpool.security.dev_pki import make_dev_pki
    from kvpool.storage_node.security_config import credentials_from_args

    render = renders[value_set]
    container = render.container("node")
    root = tmp_path / "root"
    pki = make_dev_pki(tmp_path / "pki", hosts=["kv-kvpool-master.cache.svc"])
    (root / "etc/kvpool/tls").mkdir(parents=True)
    (root / "etc/kvpool/tls/ca.crt").write_bytes(pki.ca.read_bytes())
    (root / "etc/kvpool/client-tls").mkdir(parents=True)
    cert, key = pki.client_certificate("kvpool://node/shared", "node")
    (root / "etc/kvpool/client-tls/tls.crt").write_bytes(cert.read_bytes())
    (root / "etc/kvpool/client-tls/tls.key").write_bytes(key.read_bytes())
    env = {e["name"]: e.get("value") for e in container["env"]}
    if "KVPOOL_TOKEN_FILE" in env:
        node_id = "kv-kvpool-node-0"
        token_file = root / env["KVPOOL_TOKEN_FILE"].lstrip("/").replace(
            "$(POD_NAME)", node_id
        ).replace("$(K8S_NODE_NAME)", node_id)
        token_file.parent.mkdir(parents=True)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            create = ["token", "create", "--credentials", str(tmp_path / "c.json")]
            kvpool_main([*create, "--name", "n0", "--role", "node", "--node-id", node_id])
        token_file.write_text(out.getvalue())
        monkeypatch.setenv("KVPOOL_TOKEN_FILE", str(token_file))
    for name in ("KVPOOL_TOKEN", "KVPOOL_TLS_CA", "KVPOOL_TLS_CERT", "KVPOOL_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    argv = [
        f"{a.split('=')[0]}={root}{a.split('=', 1)[1]}" if "=/etc/kvpool/" in a else a
        for a in container_argv(container)
    ]
    args = parse_cli(argv)
    credentials = credentials_from_args(args, parse_master(args.master))
    if render.values["auth"]["insecure"]:
        assert credentials.token is None and credentials.tls is None
    else:
        assert credentials.token and credentials.tls is not None
        assert (credentials.tls.cert is not None) is render.values["tls"]["requireClientCert"]


# ------------------------------------------------------------------------ values that cannot work


#: UCX_TLS values, as an operator might tune them: remote transports, exclusions, UCX's
#: defaults (empty), and local ones only.
UCX_TLS_VALUES = (
    "tcp,self",
    "tcp,sm,self",
    "rc,sm",
    "ud:aux,sm,self",
    "dc",
    "ib",
    "all",
    "TCP",
    "^sm",
    "",
    "sm,,self",
    "sm,self",
    "sm,cma,self",
    "posix,sysv,xpmem,knem,self",
    "cuda,sm,self",
    "rocm,rocm_gdr,self",
    "ZE_COPY,ze_ipc,sm",
    # Every name the node takes for local (its LOCAL_TRANSPORT_NAMES): the chart's list must
    # hold them all, or it refuses what the node would start with.
    ",".join(sorted(LOCAL_TRANSPORT_NAMES)),
)


@pytest.mark.parametrize("ucx_tls", UCX_TLS_VALUES)
def test_a_ucx_tls_the_secure_node_would_refuse_is_refused_when_rendering(
    render: Renderer,
    render_release: Callable[[dict[str, Any]], Render],
    monkeypatch: pytest.MonkeyPatch,
    ucx_tls: str,
) -> None:
    """(values.yaml suggested UCX_TLS=tcp,self as tuning, and the hostNetwork example set
    tcp,sm,self on a secure cluster: UCX over TCP, unchecked, beside a NetworkPolicy and NOTES
    that describe the checked stream only.) The chart reads storage.extraEnv's UCX_TLS as the
    node does (storage_node/main.py): what a secure node would refuse to start with, the
    render refuses, saying what to do; storage.ucxTcp, or an insecure cluster, accepts it."""
    from kvpool.storage_node.main import _non_local_transports, _ucx_config

    env = [{"name": "UCX_TLS", "value": ucx_tls}]
    monkeypatch.setenv("UCX_TLS", ucx_tls)
    wider = _non_local_transports(ucx_tls)
    if wider:
        message = rejected(render, {"storage": {"extraEnv": env}})
        assert f"storage.extraEnv sets UCX_TLS={json.dumps(ucx_tls)}" in message
        assert f"reach other hosts ({', '.join(wider)})" in message
        assert "drop UCX_TLS from storage.extraEnv" in message
        assert "set storage.ucxTcp=true" in message
    else:  # local transports only: the node starts with them, shared memory only
        container = render_release({"storage": {"extraEnv": env}}).container("node")
        assert {"name": "UCX_TLS", "value": ucx_tls} in container["env"]
        assert _ucx_config(parse_cli(container_argv(container))) == {"TLS": ucx_tls}
    for opted_in in (
        {"storage": {"extraEnv": env, "ucxTcp": True}},
        {"storage": {"extraEnv": env}, "auth": {"insecure": True}},
    ):
        container = render_release(opted_in).container("node")
        assert {"name": "UCX_TLS", "value": ucx_tls} in container["env"]
        assert _ucx_config(parse_cli(container_argv(container))) is None  # UCX's own reading


def test_no_example_sets_a_remote_ucx_tls_without_ucx_tcp(
    renders: dict[str, Render], value_set: str
) -> None:
    """Neither the value sets nor values.yaml's own example of storage.extraEnv."""
    from kvpool.storage_node.main import _non_local_transports

    render = renders[value_set]
    for env in render.container("node")["env"]:
        if env["name"] == "UCX_TLS" and not render.values["auth"]["insecure"]:
            assert render.values["storage"]["ucxTcp"] or not _non_local_transports(env["value"])
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    (example,) = [line for line in lines if "Extra environment variables, e.g." in line]
    assert "UCX_TLS" not in example


@pytest.mark.parametrize("kind", ["DaemonSet", "StatefulSet"])
def test_insecure_nodes_keep_their_id_where_a_segment_outlives_the_pod(
    render_release: Callable[[dict[str, Any]], Render],
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    """(An insecure DaemonSet passed no --node-id: the id, and the warm-restart directory
    named after it, followed the random pod name, so a pod rolled onto the same host never
    found its segment, and the old one stayed in the host's /dev/shm.) Where a segment outlives
    the pod, an insecure node takes the stable id a secure one does; elsewhere the CLI's fresh
    one."""
    from kvpool.storage_node import main as node_main
    from kvpool.storage_node.segment_layout import shm_directory

    id_var = "POD_NAME" if kind == "StatefulSet" else "K8S_NODE_NAME"
    stable = "kv-kvpool-node-0" if kind == "StatefulSet" else "gpu-host-7"
    for segment in ({"warmRestart": {"enabled": True}}, {"nvme": {"enabled": True}}):
        render = render_release({"auth": {"insecure": True}, "storage": {"kind": kind, **segment}})
        argv = [a.replace(f"<{id_var}>", stable) for a in container_argv(render.container("node"))]
        args = parse_cli(argv)
        ids = set()
        for pod in ("kv-kvpool-node-7xk2p", "kv-kvpool-node-q9d4m"):  # before and after a roll
            monkeypatch.setattr(node_main.socket, "gethostname", lambda pod=pod: pod)
            ids.add((node_main.node_id_of(args), shm_directory(args.shm_dir, args.node_id or pod)))
        assert ids == {(stable, shm_directory(args.shm_dir, stable))}
    plain = render_release({"auth": {"insecure": True}, "storage": {"kind": kind}})
    assert parse_cli(container_argv(plain.container("node"))).node_id is None


def _host_segment_dirs(render: Render, node_id: str) -> set[PurePosixPath]:
    """The host directories of a storage node's segments that live in a hostPath (warm restart's
    DRAM segment, an NVMe segment), where the node (with ``node_id``) puts them: the real
    segment_layout, the container's paths mapped through its volume mounts to the host."""
    from kvpool.storage_node.segment_layout import nvme_directory, shm_directory

    container = render.container("node")
    argv = container_argv(container)
    id_var = "POD_NAME" if render.values["storage"]["kind"] == "StatefulSet" else "K8S_NODE_NAME"
    args = parse_cli([a.replace(f"<{id_var}>", node_id) for a in argv])
    assert args.node_id == node_id
    volumes = {v["name"]: v for v in _pod(_workload(render, "node"))["volumes"]}
    on_host = {
        PurePosixPath(m["mountPath"]): PurePosixPath(volumes[m["name"]]["hostPath"]["path"])
        for m in container["volumeMounts"]
        if "hostPath" in volumes[m["name"]]
    }

    def host_path(path: Path) -> PurePosixPath:
        inside = PurePosixPath(path)
        (mount,) = [m for m in on_host if inside.is_relative_to(m)]
        return on_host[mount] / inside.relative_to(mount)

    found = {host_path(nvme_directory(p)) for p in args.nvme}
    if args.dram_shm:
        found.add(host_path(shm_directory(args.shm_dir, args.node_id)))
    return found


TWO_RELEASES = (
    (("dev", "team-a"), ("staging", "team-b")),
    (("dev", "team-a"), ("dev", "team-b")),  # same name: the same StatefulSet pod names
    (("dev", "team-a"), ("staging", "team-a")),
)


@pytest.mark.parametrize("kind", ["DaemonSet", "StatefulSet"])
@pytest.mark.parametrize("insecure", [False, True])
def test_two_releases_never_share_a_segment_directory_on_a_host(
    render_as: Callable[[dict[str, Any], str, str], Render], kind: str, insecure: bool
) -> None:
    """(Two releases with storage nodes on one Kubernetes node took the same --node-id, the
    Kubernetes node's name (or, same-named, the same pod names), and the same segment directory
    in the shared hostPath: while one release's node ran, the other's crash-looped; once it
    stopped, the other's node took its segment and its master served the first release's
    objects.) Node ids stay as they are (node tokens are keyed by them); each release keeps its
    segments in a directory of its own, <hostPath>/<namespace>_<fullname>/."""
    values = {
        "auth": {"insecure": insecure},
        "storage": {"kind": kind, "warmRestart": {"enabled": True}, "nvme": {"enabled": True}},
    }

    def release(name: str, namespace: str, extra: dict[str, Any] | None = None) -> Render:
        return render_as({**values, **(extra or {})}, name, namespace)

    def node_id(render: Render) -> str:  # both on Kubernetes node gpu-host-7
        return f"{render.fullname}-node-0" if kind == "StatefulSet" else "gpu-host-7"

    for first, second in TWO_RELEASES:
        a, b = release(*first), release(*second)
        dirs_a, dirs_b = _host_segment_dirs(a, node_id(a)), _host_segment_dirs(b, node_id(b))
        assert len(dirs_a) == len(dirs_b) == 2  # the DRAM segment's and the NVMe segment's
        for mine in dirs_a:
            for theirs in dirs_b:
                assert not mine.is_relative_to(theirs) and not theirs.is_relative_to(mine), (
                    f"{first} and {second} share {mine} / {theirs}"
                )
        assert dirs_a == {
            PurePosixPath(f"/dev/shm/kvpool/{a.namespace}_{a.fullname}/kvpool-{node_id(a)}-dram"),
            PurePosixPath(f"/mnt/nvme/kvpool/{a.namespace}_{a.fullname}/kvpool-nvme"),
        }
    # perRelease=false pins the earlier layout (an upgraded install keeps its segments; one
    # release per host only): directly in the host directory.
    pinned = {"perRelease": False}
    old = release(
        "dev",
        "team-a",
        {
            "storage": {
                **values["storage"],
                "warmRestart": {"enabled": True, "hostPath": pinned},
                "nvme": {"enabled": True, "hostPath": pinned},
            }
        },
    )
    assert _host_segment_dirs(old, node_id(old)) == {
        PurePosixPath(f"/dev/shm/kvpool/kvpool-{node_id(old)}-dram"),
        PurePosixPath("/mnt/nvme/kvpool/kvpool-nvme"),
    }
    assert _flags(old.container("node")["args"])["--shm-dir"] == "/var/lib/kvpool/shm"


def test_an_nvme_claim_is_the_pods_own_and_keeps_its_path(
    render_release: Callable[..., Render],
) -> None:
    """A claim (source: pvc) is no directory another release can reach: --nvme stays the mount
    path, so a StatefulSet's existing claims keep their segments across the upgrade."""
    render = render_release(
        {"storage": {"kind": "StatefulSet", "nvme": {"enabled": True, "source": "pvc"}}}
    )
    args = render.container("node")["args"]
    assert args[args.index("--nvme") + 1] == render.values["storage"]["nvme"]["mountPath"]


def test_refuses_several_bundled_etcd_members_without_persistence(
    render: Renderer, render_release: Callable[[dict[str, Any]], Render]
) -> None:
    """(A member replaced with an empty emptyDir started with --initial-cluster-state=new and
    crash-looped: "member ... has already been bootstrapped".)"""
    etcd = {"bundled": {"replicas": 3, "persistence": {"enabled": False}}}
    message = rejected(render, {"master": {"replicas": 2}, "etcd": etcd})
    assert "etcd.bundled.persistence.enabled is false with etcd.bundled.replicas=3" in message
    assert "has already been bootstrapped" in message
    assert "Turn etcd.bundled.persistence.enabled on, or run one member" in message
    alone = {"bundled": {"replicas": 1, "persistence": {"enabled": False}}}
    render = render_release({"master": {"replicas": 2}, "etcd": alone})
    members = render.get("StatefulSet", f"{render.fullname}-etcd")
    assert members["spec"]["replicas"] == 1
    assert {"name": "data", "emptyDir": {}} in _pod(members)["volumes"]
    render_release({"etcd": etcd})  # (one master: no etcd at all)


def test_an_upgrade_never_changes_the_bundled_etcd_member_count(
    chart: Any, chart_dir: Path, tmp_path: Path
) -> None:
    """(Scaling etcd.bundled.replicas from 3 to 5 started two members with a cluster of their
    own, which never joined: "cluster ID mismatch".) On an upgrade the chart compares with the
    StatefulSet running in the cluster (lookup); offline lookup answers nothing, so this copy
    of the chart answers it with a StatefulSet of three members."""
    import shutil

    copy = tmp_path / "kvpool"
    shutil.copytree(chart_dir, copy)
    helpers = copy / "templates" / "_helpers.tpl"
    lookup = 'lookup "apps/v1" "StatefulSet" .Release.Namespace (include "kvpool.etcd.fullname" .)'
    assert helpers.read_text().count(lookup) == 1
    helpers.write_text(helpers.read_text().replace(lookup, 'dict "spec" (dict "replicas" 3)'))
    five = {"master": {"replicas": 3}, "etcd": {"bundled": {"replicas": 5}}}
    with helm.Chart.load(str(copy)) as running_three:

        def upgrade(values: dict[str, Any]) -> dict[str, str]:
            return running_three.render(values, name="kv", namespace="cache", is_upgrade=True)

        message = rejected(upgrade, five)
        assert (
            "etcd.bundled.replicas is 5 but the bundled etcd (StatefulSet kv-kvpool-etcd) runs "
            "3 members" in message
        )
        assert "Keep etcd.bundled.replicas=3" in message
        assert '"Changing the number of etcd members"' in message
        assert "cannot be changed by an upgrade" in rejected(
            upgrade, {"master": {"replicas": 3}, "etcd": {"bundled": {"replicas": 1}}}
        )
        upgrade({"master": {"replicas": 3}})  # the same three members
        running_three.render(five, name="kv", namespace="cache", is_install=True)  # (a new one)
    # Offline (helm template, a client-side dry run) lookup answers nothing: nothing to compare.
    chart.render(five, name="kv", namespace="cache", is_upgrade=True)
    docs = (REPO / "docs" / "kubernetes.md").read_text()
    assert "### Changing the number of etcd members" in docs


@pytest.mark.parametrize("service_type", ["LoadBalancer", "NodePort"])
def test_an_exposed_master_service_publishes_no_http_port(
    render_release: Callable[[dict[str, Any]], Render], service_type: str
) -> None:
    """(A LoadBalancer or NodePort master Service published the master's unauthenticated
    /metrics, which names tenants and what each holds.) The HTTP port goes on a ClusterIP
    Service of its own, which the ServiceMonitor scrapes and NOTES name."""
    render = render_release(
        {
            "master": {"service": {"type": service_type}},
            "monitoring": {"serviceMonitor": {"enabled": True}},
        }
    )
    name = render.fullname
    exposed = render.get("Service", f"{name}-master")
    assert exposed["spec"]["type"] == service_type
    assert {p["name"] for p in exposed["spec"]["ports"]} == {"grpc", "lane"}
    metrics = render.get("Service", f"{name}-master-metrics")
    assert metrics["spec"]["type"] == "ClusterIP"
    assert metrics["spec"]["selector"] == exposed["spec"]["selector"]
    assert [(p["name"], p["port"], p["targetPort"]) for p in metrics["spec"]["ports"]] == [
        ("http", 9090, "http")
    ]
    assert _scraped_services(render) == {f"{name}-master-metrics", f"{name}-node"}
    assert f"http://{name}-master-metrics.{render.namespace}.svc:9090/metrics" in render.notes
    cluster_ip = render_release({"monitoring": {"serviceMonitor": {"enabled": True}}})
    assert "master-metrics" not in {s["metadata"]["name"] for s in cluster_ip.of_kind("Service")}
    assert _scraped_services(cluster_ip) == {f"{name}-master", f"{name}-node"}


def test_the_master_http_port_is_published_inside_the_cluster_only(
    renders: dict[str, Render], value_set: str
) -> None:
    render = renders[value_set]
    carriers = [
        s
        for s in render.of_kind("Service")
        if s["spec"]["selector"].get("app.kubernetes.io/component") == "master"
        and "http" in {p["name"] for p in s["spec"]["ports"]}
    ]
    (carrier,) = carriers  # scraped once
    assert carrier["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert carrier["spec"].get("clusterIP") != "None"


def test_external_callers_are_admitted_to_the_master_s_grpc_and_lane_ports_only(
    render_release: Callable[[dict[str, Any]], Render],
) -> None:
    """(networkPolicy.extraFrom, the only way to admit a LoadBalancer's callers, opened the
    HTTP ports and every port of the storage nodes too.)"""
    callers = {"ipBlock": {"cidr": "203.0.113.0/24"}}
    render = render_release(
        {
            "master": {"service": {"type": "LoadBalancer"}},
            "networkPolicy": {"masterExternalFrom": [callers]},
        }
    )
    admitted = {
        (policy["metadata"]["name"], port["port"])
        for policy in render.of_kind("NetworkPolicy")
        for rule in policy["spec"]["ingress"]
        if callers in rule["from"]
        for port in rule["ports"]
    }
    assert admitted == {(f"{render.fullname}-master", 50051), (f"{render.fullname}-master", 50052)}


#: (component, values giving the flag, flag, the most the process takes, just beyond it)
BOUNDS = [
    ("master", "master.leaseTtl", "--lease-ttl", 600, 600.5),
    ("master", "master.tick", "--tick", 60, 60.5),
    ("master", "master.nodeTtl", "--node-ttl", 2592000, 2592001),
    ("master", "master.reservationTimeout", "--reservation-timeout", 2592000, 2592001),
    ("master", "master.reclaimDelay", "--reclaim-delay", 2592000, 2592001),
    ("master", "master.maxInflight", "--max-inflight", 1000000, 1000001),
    ("node", "storage.heartbeatInterval", "--heartbeat-interval", 60, 60.5),
    ("node", "storage.drain.timeout", "--drain-timeout", 2592000, 2592001),
]


def _at(path: str, value: Any) -> dict[str, Any]:
    """{"a": {"b": value}} for "a.b" (a drain timeout turns drains on, which pass the flag)."""
    values: dict[str, Any] = {}
    node = values
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    if path == "storage.drain.timeout":
        values["storage"]["drain"]["onTermination"] = True
    return values


@pytest.mark.parametrize(("component", "path", "flag", "most", "beyond"), BOUNDS)
def test_the_schema_takes_what_the_processes_take(
    render: Renderer,
    render_release: Callable[[dict[str, Any]], Render],
    component: str,
    path: str,
    flag: str,
    most: float,
    beyond: float,
) -> None:
    """(The schema took values the processes refuse: the install succeeded and the pods
    crash-looped.) The most a process takes renders and parses; just beyond, the schema
    refuses it, as the real parser would."""
    container = render_release(_at(path, most)).container(component)
    argv = container_argv(container)
    args = parse_cli(argv)
    if component == "master":
        config_from_args(args)
    assert f"at '/{path.replace('.', '/')}'" in rejected(render, _at(path, beyond))
    (given,) = [a for a in argv if a.startswith(f"{flag}=")]
    with pytest.raises(CliRejected, match=re.escape(f"argument {flag}")):
        parse_cli([f"{flag}={beyond}" if a == given else a for a in argv])


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"storage": {"dram": "{}"}}, "storage.dram"),
        ({"storage": {"nvme": {"enabled": True, "size": "{}"}}}, "storage.nvme.size"),
    ],
)
def test_segments_are_at_most_128ti(
    render: Renderer,
    render_release: Callable[[dict[str, Any]], Render],
    values: dict[str, Any],
    key: str,
) -> None:
    def sized(size: str) -> dict[str, Any]:
        return json.loads(json.dumps(values).replace('"{}"', json.dumps(size)))

    args = parse_cli(container_argv(render_release(sized("128Ti")).container("node")))
    assert max([args.dram, *args.nvme_size]) == 128 << 40
    for size in ("129Ti", "128.5Ti", "131073Gi"):
        assert f"{key} is {size}: at most 128Ti" in rejected(render, sized(size))
        with pytest.raises(CliRejected, match=re.escape("128.0 TiB")):
            flag = "--dram" if key == "storage.dram" else "--nvme-size"
            parse_cli(["node", f"{flag}={size}"])


def test_refuses_an_insecure_cluster_with_https_external_etcd(render: Renderer) -> None:
    """(The render passed, and the insecure master refused to start: an https:// endpoint
    and no --etcd-ca; the nodes would have dialled it in plaintext through etcd://.)"""
    etcd = {"mode": "external", "external": {"endpoints": ["https://etcd-0.infra:2379"]}}
    values = {"master": {"replicas": 2}, "etcd": etcd, "auth": {"insecure": True}}
    message = rejected(render, values)
    assert "etcd.external.endpoints lists https://etcd-0.infra:2379, an https:// URL" in message
    assert "but auth.insecure is true" in message
    etcd["external"]["endpoints"] = ["http://etcd-0.infra:2379"]
    render(values)
    render({"etcd": {"mode": "external", "external": {"endpoints": ["https://e:2379"]}}})


def test_refuses_host_network_nodes_the_network_policy_would_shut_out(
    render: Renderer, render_release: Callable[[dict[str, Any]], Render]
) -> None:
    """(Host-network storage nodes reach the master from their hosts' addresses, which no pod
    selector matches: the master's policy admitted none of them.)"""
    message = rejected(render, {"storage": {"hostNetwork": True}})
    assert "networkPolicy.extraFrom has no ipBlock" in message
    assert "set networkPolicy.enabled=false" in message
    pods_only = {"podSelector": {"matchLabels": {"app": "x"}}}
    values = {"storage": {"hostNetwork": True}, "networkPolicy": {"extraFrom": [pods_only]}}
    assert "no ipBlock" in rejected(render, values)
    render({"storage": {"hostNetwork": True}, "networkPolicy": {"enabled": False}})
    hosts = {"ipBlock": {"cidr": "10.0.0.0/16"}}
    admitted = render_release(
        {"storage": {"hostNetwork": True}, "networkPolicy": {"extraFrom": [hosts]}}
    )
    master = admitted.get("NetworkPolicy", f"{admitted.fullname}-master")
    grpc = [
        r for r in master["spec"]["ingress"] if {"protocol": "TCP", "port": 50051} in r["ports"]
    ]
    assert any(hosts in rule["from"] for rule in grpc)
