"""``deploy/kubernetes/``: the kustomize layout, checked without a cluster.

Every core manifest validates (strictly: an unknown field fails) against the Kubernetes
OpenAPI schemas that the ``kubernetes-validate`` package ships, for the oldest and the
newest version runfleet supports; the CRD manifests (KEDA, Prometheus Operator) get structural
checks instead. Every ``runfleet`` command line parses with the real CLI (the compose
test's parser), every ``RUNFLEET_*`` variable is a setting, images are pinned, the
termination grace covers the worker's own, probes hit the paths and port the worker
serves, and the autoscalers read the streams and metric the code really writes.
"""

from __future__ import annotations

import copy
import importlib
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # kubernetes-validate ships no type information
import pytest
import yaml

import runfleet
from runfleet.broker.keys import GROUP, Keys
from runfleet.store.config import Settings
from runfleet.worker import metrics
from runfleet.worker.health import LIVENESS_PATH, READINESS_PATH
from tests.test_compose import PINNED, CommandLineError, _parse, _shell_commands

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "kubernetes"
ENTRY_POINTS = {
    "default": K8S,
    "keda": K8S / "overlays" / "keda",
    "hpa-stream-lag": K8S / "overlays" / "hpa-stream-lag",
    "cloudnativepg": K8S / "overlays" / "cloudnativepg",
}
AUTOSCALED = {"keda", "hpa-stream-lag"}
OPTIONAL = {K8S / "secret.example.yaml", K8S / "servicemonitor.yaml"}
"""Manifests deliberately outside every kustomization: applied by hand, if at all."""
VERSIONS = ("1.29", kubernetes_validate.latest_version())
"""The oldest and newest Kubernetes runfleet supports (PDB unhealthyPodEvictionPolicy is on
by default from 1.27)."""
CRD_KINDS = {
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("postgresql.cnpg.io/v1", "Cluster"),
}
VERSION = runfleet.__version__

Doc = dict[str, Any]


def _docs(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _kustomization(directory: Path) -> Doc:
    loaded: Doc = yaml.safe_load((directory / "kustomization.yaml").read_text())
    return loaded


def _resource_files(directory: Path) -> Iterator[Path]:
    """Every manifest file a kustomization pulls in, through bases and components."""
    kustomization = _kustomization(directory)
    for entry in [*kustomization.get("resources", []), *kustomization.get("components", [])]:
        target = (directory / entry).resolve()
        if target.is_dir():
            yield from _resource_files(target)
        else:
            yield target


def _manifest_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


def _all(kind: str) -> list[Doc]:
    return [d for p in _manifest_files() for d in _docs(p) if d["kind"] == kind]


def _one(kind: str) -> Doc:
    (doc,) = _all(kind)
    return doc


def _pod_specs() -> dict[str, Doc]:
    return {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]
        for p in _manifest_files()
        for d in _docs(p)
        if d["kind"] in ("Deployment", "Job")
    }


def _worker_container() -> Doc:
    (container,) = _pod_specs()["runfleet-worker"]["containers"]
    assert isinstance(container, dict)
    return container


def _worker_argv() -> list[str]:
    argv = [str(a) for a in [*_worker_container()["command"], *_worker_container().get("args", [])]]
    assert argv[:2] == ["runfleet", "worker"]
    return argv[1:]


def _config() -> dict[str, str]:
    data: dict[str, str] = _one("ConfigMap")["data"]
    return data


# ---- layout and schemas --------------------------------------------------------------


def test_every_manifest_is_in_a_kustomization_or_documented_optional() -> None:
    reachable = {p for d in ENTRY_POINTS.values() for p in _resource_files(d)}
    assert all(p.exists() for p in reachable), sorted(p for p in reachable if not p.exists())
    assert set(_manifest_files()) == reachable | OPTIONAL
    default = set(_resource_files(K8S))
    assert not default & OPTIONAL, "the secret template and CRDs stay out of the default"
    kinds = {(d["apiVersion"], d["kind"]) for p in default for d in _docs(p)}
    assert not kinds & CRD_KINDS, "the default layout must apply to a bare cluster"
    assert {k for _, k in kinds} >= {
        "Namespace",
        "ConfigMap",
        "Job",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
    }


@pytest.mark.parametrize("version", VERSIONS)
def test_core_manifests_validate_against_the_kubernetes_schemas(version: str) -> None:
    checked = 0
    for path in _manifest_files():
        for doc in _docs(path):
            if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
                continue  # no schema offline: see the structural tests below
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{path.relative_to(ROOT)} {doc['kind']}: {where}: {exc.message}")
            checked += 1
    assert checked >= 8


def test_a_misspelled_field_would_be_caught() -> None:
    deployment = copy.deepcopy(_one("Deployment"))
    spec = deployment["spec"]["template"]["spec"]
    spec["terminationGracePeriodSecond"] = spec.pop("terminationGracePeriodSeconds")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (built-in kustomize) absent")
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_kustomize_builds_each_entry_point(entry: str) -> None:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(ENTRY_POINTS[entry])],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == "runfleet", doc["metadata"]["name"]
        if (doc["apiVersion"], doc["kind"]) not in CRD_KINDS:
            kubernetes_validate.validate(doc, VERSIONS[-1], strict=True)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    images = {c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert images == {f"runfleet:{VERSION}"}
    autoscalers = {d["kind"] for d in docs} & {"ScaledObject", "HorizontalPodAutoscaler"}
    if entry not in AUTOSCALED:
        assert not autoscalers and deployment["spec"]["replicas"] >= 2
    else:
        # The autoscaler owns the replica count; a re-apply must not reset it.
        assert len(autoscalers) == 1 and "replicas" not in deployment["spec"]


# ---- command lines and settings --------------------------------------------------------


def _exec_argvs(container: Doc) -> list[list[str]]:
    found = []
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        command = (container.get(probe) or {}).get("exec", {}).get("command")
        if command:
            found.append([str(c) for c in command])
    return found


def test_every_runfleet_command_line_parses() -> None:
    lines: dict[str, list[list[str]]] = {}
    for name, spec in _pod_specs().items():
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            argvs = [[str(a) for a in [*container["command"], *container.get("args", [])]]]
            argvs += _exec_argvs(container)
            for argv in argvs:
                for line in _shell_commands(argv[2]) if argv[:2] == ["sh", "-c"] else [argv]:
                    if line[0] == "runfleet":
                        lines.setdefault(name, []).append(line[1:])
    assert lines.keys() == {"runfleet-migrate", "runfleet-worker"}
    assert lines["runfleet-migrate"] == [["migrate"]]
    # The exec-probe alternative documented beside the HTTP probes parses too.
    text = (K8S / "base" / "worker-deployment.yaml").read_text()
    (documented,) = re.findall(r'\["sh", "-c", "(runfleet fleet[^\]]*)"\]', text)
    for line in _shell_commands(documented.replace('\\"', '"')):
        lines["runfleet-worker"].append(line[1:])
    for name, argvs in lines.items():
        for argv in argvs:
            try:
                _parse(argv)
            except CommandLineError as exc:
                pytest.fail(f"{name}: {exc}")
    worker = _parse(_worker_argv())
    assert worker["metrics_port"] == 9100 and worker["log_json"] is True
    # One process per pod: probes and the metrics port then speak for the whole pod.
    assert worker["processes"] == 1
    assert lines["runfleet-worker"][-1][:2] == ["fleet", "--check"]


def test_the_worker_serves_flows_on_the_queues_it_reads() -> None:
    from runfleet.worker.authoring.flows import registered

    worker = _parse(_worker_argv())
    for module in str(worker["flows"]).split(","):
        importlib.import_module(module)
    queues = set(str(worker["queues"]).split(","))
    assert {f.queue for f in registered().values()} & queues


def _env(container: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in container.get("env", [])}


def test_runfleet_variables_are_settings() -> None:
    fields = {f"RUNFLEET_{name.upper()}" for name in Settings.model_fields}
    config = _config()
    used = set(config)
    secret = _one("Secret")
    secret_keys = set(secret["stringData"])
    for spec in _pod_specs().values():
        for container in spec["containers"]:
            env = _env(container)
            used |= {name for name in env if name.startswith("RUNFLEET_")}
            for ref in container.get("envFrom", []):
                assert ref["configMapRef"]["name"] == _one("ConfigMap")["metadata"]["name"]
            for var in env.values():
                secret_ref = var.get("valueFrom", {}).get("secretKeyRef")
                if secret_ref:
                    assert secret_ref["name"] == secret["metadata"]["name"]
                    assert secret_ref["key"] in secret_keys, var
    unknown = used - fields
    assert not unknown, f"not fields of runfleet.store.config.Settings: {sorted(unknown)}"
    Settings.model_validate({k.removeprefix("RUNFLEET_").lower(): v for k, v in config.items()})
    # Credentials only from the Secret; the host id per pod from its name.
    assert not {"RUNFLEET_DATABASE_URL", "RUNFLEET_REDIS_URL"} & set(config)
    worker_env = _env(_worker_container())
    assert "secretKeyRef" in worker_env["RUNFLEET_DATABASE_URL"]["valueFrom"]
    assert "secretKeyRef" in worker_env["RUNFLEET_REDIS_URL"]["valueFrom"]
    host = worker_env["RUNFLEET_HOST_ID"]["valueFrom"]["fieldRef"]
    assert host["fieldPath"] == "metadata.name"


def test_the_secret_is_a_template_without_credentials() -> None:
    secret = _one("Secret")
    assert "data" not in secret, "placeholders only, as readable stringData"
    for key, value in secret["stringData"].items():
        assert "REPLACE_ME" in value, f"{key} must be a placeholder"
    assert K8S / "secret.example.yaml" in OPTIONAL


def test_images_are_pinned() -> None:
    for name, spec in _pod_specs().items():
        for container in spec["containers"]:
            image = container["image"]
            assert PINNED.match(image) or "@sha256:" in image, f"{name}: {image} is not pinned"
            assert image == f"runfleet:{VERSION}", f"{name}: tag the image with the version"
    (image,) = _kustomization(K8S / "base")["images"]
    assert image["name"] == "runfleet" and image["newTag"] == VERSION


# ---- stopping, probes, resources -------------------------------------------------------


def test_termination_grace_covers_the_worker_grace_and_its_release() -> None:
    spec = _pod_specs()["runfleet-worker"]
    grace = Settings.model_validate({"grace_period": _config()["RUNFLEET_GRACE_PERIOD"]})
    total = spec["terminationGracePeriodSeconds"]
    # SIGKILL lands `total` s after SIGTERM: after the grace period and the release that
    # follows it (compose allows 5 s for that), but not so late that a stop hangs.
    assert grace.grace_period + 5 <= total <= grace.grace_period + 60, (grace, total)
    # SIGTERM goes straight to the worker: no preStop hook delays it or eats the budget.
    assert "lifecycle" not in _worker_container()
    assert _worker_container()["command"][0] == "runfleet", "PID 1 must be the CLI, no shell"


def test_probes_hit_the_health_paths_on_the_metrics_port() -> None:
    container = _worker_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    port = _parse(_worker_argv())["metrics_port"]
    assert ports["metrics"] == port
    paths = {}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        http = container[probe]["httpGet"]
        assert http["port"] in ("metrics", port), probe
        paths[probe] = http["path"]
    assert paths == {
        "startupProbe": LIVENESS_PATH,
        "livenessProbe": LIVENESS_PATH,
        "readinessProbe": READINESS_PATH,
    }
    # Liveness must tolerate more than the worker's own stall threshold (3 heartbeats).
    live = container["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] >= 3 * float(
        _config()["RUNFLEET_HEARTBEAT_INTERVAL"]
    )
    annotations = _one("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == "/metrics"


def test_service_pdb_and_servicemonitor_select_the_worker_pods() -> None:
    deployment = _one("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = _one("Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    pdb = _one("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    monitor = _one("ServiceMonitor")
    service_labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service_labels.items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == {"metrics"}


def test_worker_resources_request_cpu_and_memory_and_limit_memory() -> None:
    resources = _worker_container()["resources"]
    assert {"cpu", "memory"} <= resources["requests"].keys()
    assert "memory" in resources["limits"]
    # No CPU limit, on purpose (CFS throttling stalls the lease loop; see the manifest).
    assert "cpu" not in resources["limits"]

    def mebibytes(quantity: str) -> int:
        match = re.fullmatch(r"(\d+)(Mi|Gi)", quantity)
        assert match, quantity
        return int(match[1]) * (1024 if match[2] == "Gi" else 1)

    assert mebibytes(resources["limits"]["memory"]) >= mebibytes(resources["requests"]["memory"])


# ---- autoscaling on queue lag ----------------------------------------------------------

_SCALEDOBJECT_SPEC = {
    "scaleTargetRef",
    "pollingInterval",
    "cooldownPeriod",
    "initialCooldownPeriod",
    "idleReplicaCount",
    "minReplicaCount",
    "maxReplicaCount",
    "fallback",
    "advanced",
    "triggers",
}
_REDIS_STREAMS_METADATA = {
    "address",
    "addressFromEnv",
    "host",
    "hostFromEnv",
    "port",
    "portFromEnv",
    "usernameFromEnv",
    "passwordFromEnv",
    "stream",
    "consumerGroup",
    "pendingEntriesCount",
    "streamLength",
    "lagCount",
    "activationLagCount",
    "enableTLS",
    "unsafeSsl",
    "databaseIndex",
}
"""KEDA's documented redis-streams trigger metadata (KEDA >= 2.12)."""


def _streams_for_worker_queues() -> set[str]:
    keys = Keys(_config()["RUNFLEET_REDIS_PREFIX"])
    queues = str(_parse(_worker_argv())["queues"]).split(",")
    return {keys.stream(q) for q in queues} | {keys.recovery_stream(q) for q in queues}


def _hpa_behavior_validates(behavior: Doc) -> None:
    """A behavior block is autoscaling/v2's: validate it inside a minimal HPA."""
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "behavior-check"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x"},
            "maxReplicas": 2,
            "behavior": behavior,
        },
    }
    kubernetes_validate.validate(hpa, VERSIONS[-1], strict=True)


def test_keda_scales_on_the_lag_of_the_streams_the_workers_read() -> None:
    scaled = _one("ScaledObject")
    spec = scaled["spec"]
    assert set(spec) <= _SCALEDOBJECT_SPEC, set(spec) - _SCALEDOBJECT_SPEC
    assert spec["scaleTargetRef"]["name"] == _one("Deployment")["metadata"]["name"]
    # Never zero workers: the recovery sweeps (stale leases, timers) run inside them.
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    _hpa_behavior_validates(spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"])
    auth = _one("TriggerAuthentication")
    secret = _one("Secret")
    for ref in auth["spec"]["secretTargetRef"]:
        assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]
    streams = set()
    for trigger in spec["triggers"]:
        assert trigger["type"] == "redis-streams"
        meta = trigger["metadata"]
        assert set(meta) <= _REDIS_STREAMS_METADATA, set(meta) - _REDIS_STREAMS_METADATA
        # KEDA metadata is a map of strings: an unquoted number is refused by the CRD.
        assert all(isinstance(v, str) for v in meta.values()), meta
        assert meta["consumerGroup"] == GROUP
        assert int(meta["lagCount"]) >= 1 and "activationLagCount" in meta
        assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
        streams.add(meta["stream"])
    # Both lanes of every queue the Deployment reads: new runs and runs to resume.
    assert streams == _streams_for_worker_queues()


def test_hpa_scales_on_the_metric_the_workers_export() -> None:
    hpa = _one("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == _one("Deployment")["metadata"]["name"]
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External", "one queue-wide value, not a per-pod metric"
    external = metric["external"]
    (exported,) = metrics.STREAM_LAG.describe()
    assert external["metric"]["name"] == exported.name
    selector = external["metric"]["selector"]["matchLabels"]
    assert set(selector) <= set(metrics.STREAM_LAG._labelnames)
    assert selector["queue"] in str(_parse(_worker_argv())["queues"]).split(",")
    assert external["target"]["type"] == "AverageValue"


def test_the_documented_kubectl_commands_name_real_paths() -> None:
    text = (K8S / "kustomization.yaml").read_text()
    for match in re.findall(r"kubectl apply -k ([\w/.-]+)", text):
        assert (ROOT / match / "kustomization.yaml").exists(), match
    for name in re.findall(r"secret generic (\S+)", text):
        assert name == _one("Secret")["metadata"]["name"]
    keys = set(re.findall(r"--from-literal=([\w-]+)=", text))
    assert keys == set(_one("Secret")["stringData"])


# ---- CloudNativePG --------------------------------------------------------------------
# The operator's CRD schema is not in kubernetes-validate: the Cluster gets structural
# checks of what runfleet relies on, and the overlay's patches are checked as rendered.


def _cnpg_cluster() -> Doc:
    (doc,) = _docs(K8S / "components" / "cloudnativepg" / "cluster.yaml")
    assert (doc["apiVersion"], doc["kind"]) == ("postgresql.cnpg.io/v1", "Cluster")
    return doc


def test_the_cloudnativepg_cluster_replicates_synchronously() -> None:
    spec = _cnpg_cluster()["spec"]
    assert spec["instances"] >= 2
    sync = spec["postgresql"]["synchronous"]
    assert sync["method"] in ("any", "first") and 1 <= sync["number"] < spec["instances"]
    assert sync.get("dataDurability", "required") == "required"
    assert spec["postgresql"]["parameters"].get("synchronous_commit", "on") in (
        "on", "remote_write", "remote_apply",
    )  # fmt: skip
    assert spec["bootstrap"]["initdb"]["database"] and spec["bootstrap"]["initdb"]["owner"]
    assert "@" not in str(spec) and "password" not in str(spec).lower()
    image = spec["imageName"]
    assert re.fullmatch(r"[^:]+:\d+\.\d+", image), f"unpinned Postgres image {image}"


def _url_source(container: Doc) -> Doc:
    (env,) = [e for e in container["env"] if e["name"] == "RUNFLEET_DATABASE_URL"]
    assert set(env) == {"name", "valueFrom"}, env
    ref: Doc = env["valueFrom"]["secretKeyRef"]
    return ref


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (built-in kustomize) absent")
def test_cloudnativepg_workers_connect_to_the_read_write_service() -> None:
    """The operator's ``<cluster>-app`` Secret's ``uri`` names ``<cluster>-rw``: the
    Service that follows the primary through a failover."""
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(ENTRY_POINTS["cloudnativepg"])],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    (cluster,) = [d for d in docs if d["kind"] == "Cluster"]
    app_secret = {"name": f"{cluster['metadata']['name']}-app", "key": "uri"}
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "Job")]
    assert len(pods) == 2
    for pod in pods:
        (container,) = pod["containers"]
        assert _url_source(container) == app_secret, container["name"]
        redis = [e for e in container["env"] if e["name"] == "RUNFLEET_REDIS_URL"]
        assert all(e["valueFrom"]["secretKeyRef"]["name"] == "runfleet-connections" for e in redis)
