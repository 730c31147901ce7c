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
from pathlib import Path
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

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "helm" / "kvpool"
#: Custom resources: no Kubernetes OpenAPI schema covers them (see test_service_monitor_*).
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}

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
    assert {"Deployment", "Service", "ServiceAccount"} <= kinds
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
    assert render.get("Deployment", f"{render.fullname}-master")["spec"]["replicas"] == 3
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
    assert initial == "--initial-cluster=" + ",".join(f"{p}=http://{p}.{domain}:2380" for p in pods)
    args = parse_cli(container_argv(render.container("master")))
    assert args.etcd == ",".join(f"http://{p}.{domain}:2379" for p in pods)
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
    master = render.get("Deployment", f"{render.fullname}-master")
    assert master["spec"]["strategy"]["type"] == "RollingUpdate"


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
    assert args[args.index("--nvme") + 1] == "/nvme"
    assert args[args.index("--nvme-size") + 1] == "1Ti"


def test_nvme_flags_only_when_nvme_is_enabled(renders: dict[str, Render], value_set: str) -> None:
    render = renders[value_set]
    container = render.container("node")
    has_flags = any(a.startswith("--nvme") for a in container["args"])
    has_mount = any(m["name"] == "nvme" for m in container["volumeMounts"])
    assert has_flags == has_mount == render.values["storage"]["nvme"]["enabled"]


def test_host_network_daemonset(renders: dict[str, Render]) -> None:
    render = renders["hostnetwork-daemonset"]
    pod = render.get("DaemonSet", f"{render.fullname}-node")["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"  # still resolves the master Service
    container = render.container("node")
    args = parse_cli(container_argv(container))
    assert args.http_port == named_port(container, "http") == 19091
    assert {"name": "UCX_TLS", "value": "tcp,sm,self"} in container["env"]
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
    assert args.node_id is None  # the CLI's default: fresh for DRAM, kept for NVMe
    assert args.log_format == "json"
    if storage["nvme"]["enabled"]:
        assert args.nvme == [storage["nvme"]["mountPath"]]
        assert args.nvme_size == [parse_size(storage["nvme"]["size"])]
    else:
        assert args.nvme == [] and args.nvme_size == []


def _node_master_address(render: Render) -> str:
    """Nodes reach a lone master through its Service, elected masters through etcd."""
    master_args = render.container("master")["args"]
    etcd = next((a.split("=", 1)[1] for a in master_args if a.startswith("--etcd=")), None)
    if etcd is None:
        return render.master_address
    cluster = next(a.split("=", 1)[1] for a in master_args if a.startswith("--cluster="))
    endpoints = [e.removeprefix("http://").removeprefix("https://") for e in etcd.split(",")]
    return f"etcd://{','.join(endpoints)}/{cluster}"


def test_probes_hit_the_health_endpoints(renders: dict[str, Render], value_set: str) -> None:
    render = renders[value_set]
    for component in ("master", "node"):
        container = render.container(component)
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
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
    ha = renders["ha-bundled-etcd"]
    endpoints, _, cluster = _node_master_address(ha).removeprefix("etcd://").partition("/")
    assert "elect a leader through etcd" in ha.notes
    assert f"KVPOOL_MASTER=etcd://{endpoints.split(',')[0]}/{cluster}" in ha.notes
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
    match_labels = spec["selector"]["matchLabels"]
    (expression,) = spec["selector"]["matchExpressions"]
    assert expression["key"] == "app.kubernetes.io/component"
    assert expression["operator"] == "In"

    def selected(service: dict[str, Any]) -> bool:
        service_labels = service["metadata"]["labels"]
        return match_labels.items() <= service_labels.items() and (
            service_labels.get(expression["key"]) in expression["values"]
        )

    scraped = {s["metadata"]["name"] for s in render.of_kind("Service") if selected(s)}
    assert scraped == {f"{render.fullname}-master", f"{render.fullname}-node"}
    (endpoint,) = spec["endpoints"]
    assert endpoint["path"] == "/metrics"
    for service in render.of_kind("Service"):
        if service["metadata"]["name"] in scraped:
            assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert re.fullmatch(r"([0-9]+(ms|s|m|h))+", endpoint["interval"])


def test_service_monitor_names_only_exported_metrics(
    renders: dict[str, Render], exported: tuple[set[str], set[str]]
) -> None:
    (monitor,) = renders["ha-bundled-etcd"].of_kind("ServiceMonitor")
    used = set(re.findall(r"\bkvpool_[a-z0-9_]+", yaml.safe_dump(monitor)))
    assert used <= exported[0], sorted(used - exported[0])


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
