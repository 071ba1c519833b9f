"""deploy/: the Helm values for Dagster's chart, the SGLang fleet manifest and the supervised head node (supervisord
and systemd), validated offline.

No cluster is reachable here (`kubectl apply --dry-run=client` still asks the API server for its schema), so
the checks are structural: the values use only keys of the chart's values schema (chart 1.13.27) in the
shapes it requires, carry the instance settings of dagster.yaml, and reference secrets instead of holding
them; the fleet manifest is exactly what the generator writes (launch flags from `fleet up`'s launcher) and its
objects fit together (selectors, service names, endpoints); the head node's two supervisors (supervisord's
deploy/head/, systemd's deploy/systemd/) run the same three commands, each restarted when it dies, after one
initialisation of the instance, with credentials from the environment file alone (the head node run and its daemon
killed: tests/integration/test_head_node.py).
"""

import configparser
import re
import shlex
import tomllib

import pytest
import yaml

from dagster_project.sglang import k8s_manifest
from dagster_project.sglang.launch import ServerOptions, server_command
from dagster_project.sglang.launch_plan import plan_capacity
from tests.support.paths import PROJECT_ROOT

DEPLOY = PROJECT_ROOT / "deploy"
VALUES = yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())
INSTANCE = yaml.safe_load((PROJECT_ROOT / "dagster.yaml").read_text())
PYPROJECT = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
MANIFEST_FILE = DEPLOY / "sglang-fleet.yaml"

# The chart's top-level values and the parts of its schema these values use (values.schema.json, 1.13.27).
CHART_TOP_LEVEL = {
    "dagsterWebserver", "dagster-user-deployments", "postgresql", "generatePostgresqlPasswordSecret",
    "generateCeleryConfigSecret", "rabbitmq", "redis", "flower", "ingress", "imagePullSecrets",
    "computeLogManager", "scheduler", "runLauncher", "pythonLogs", "dagsterDaemon", "busybox", "migrate",
    "telemetry", "serviceAccount", "global", "retention", "additionalInstanceConfig",
}  # fmt: skip
K8S_RUN_LAUNCHER_REQUIRED = {
    "imagePullPolicy", "loadInclusterConfig", "envConfigMaps", "envSecrets", "envVars", "volumeMounts", "volumes",
}  # fmt: skip
K8S_RUN_LAUNCHER_ALLOWED = K8S_RUN_LAUNCHER_REQUIRED | {
    "image", "jobNamespace", "kubeconfigFile", "labels", "failPodOnRunFailure", "resources", "schedulerName",
    "securityContext", "runK8sConfig",
}  # fmt: skip
RUN_K8S_CONFIG_ALLOWED = {"containerConfig", "podSpecConfig", "podTemplateSpecMetadata", "jobSpecConfig", "jobMetadata"}
USER_DEPLOYMENT_REQUIRED = {"name", "image", "dagsterApiGrpcArgs", "port"}
PULL_POLICIES = {"Always", "IfNotPresent", "Never"}


def test_the_values_use_only_keys_of_the_charts_schema():
    assert set(VALUES) <= CHART_TOP_LEVEL, set(VALUES) - CHART_TOP_LEVEL
    launcher = VALUES["runLauncher"]
    assert launcher["type"] == "K8sRunLauncher" and set(launcher["config"]) == {"k8sRunLauncher"}
    k8s = launcher["config"]["k8sRunLauncher"]
    assert K8S_RUN_LAUNCHER_REQUIRED <= set(k8s) <= K8S_RUN_LAUNCHER_ALLOWED
    assert k8s["imagePullPolicy"] in PULL_POLICIES and set(k8s["runK8sConfig"]) <= RUN_K8S_CONFIG_ALLOWED
    coordinator = VALUES["dagsterDaemon"]["runCoordinator"]
    assert coordinator["enabled"] and coordinator["type"] == "QueuedRunCoordinator"
    assert set(coordinator["config"]) == {"queuedRunCoordinator"}
    assert VALUES["dagsterWebserver"]["service"].keys() == {"type", "port"}
    postgres = VALUES["postgresql"]
    assert {"enabled", "postgresqlHost", "postgresqlUsername", "postgresqlDatabase", "service"} <= set(postgres)


def test_the_code_location_is_this_project_and_its_image_carries_what_run_pods_load():
    (deployment,) = VALUES["dagster-user-deployments"]["deployments"]
    assert USER_DEPLOYMENT_REQUIRED <= set(deployment)
    assert deployment["image"]["pullPolicy"] in PULL_POLICIES and deployment["image"]["repository"]
    args = deployment["dagsterApiGrpcArgs"]
    assert args[args.index("--module-name") + 1] == PYPROJECT["tool"]["dagster"]["module_name"]
    # Run pods and the code server read the fleet's endpoints from the manifest's ConfigMap.
    for env_sources in (
        deployment["envConfigMaps"],
        VALUES["runLauncher"]["config"]["k8sRunLauncher"]["envConfigMaps"],
    ):
        assert {"name": k8s_manifest.ENDPOINTS_CONFIGMAP} in env_sources
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    integrations = {dep.split("==")[1] for dep in PYPROJECT["project"]["dependencies"] if dep.startswith("dagster-aws")}
    assert f'"dagster-k8s=={integrations.pop()}"' in dockerfile  # the launcher's package, paired with Dagster


def test_the_instance_settings_are_dagster_yamls():
    daemon = VALUES["dagsterDaemon"]
    queued = daemon["runCoordinator"]["config"]["queuedRunCoordinator"]
    assert queued["maxConcurrentRuns"] == INSTANCE["concurrency"]["runs"]["max_concurrent_runs"]
    assert VALUES["additionalInstanceConfig"]["concurrency"] == {"pools": INSTANCE["concurrency"]["pools"]}
    retries = INSTANCE["run_retries"]
    assert daemon["runRetries"] == {
        "enabled": retries["enabled"],
        "maxRetries": retries["max_retries"],
        "retryOnAssetOrOpFailure": retries["retry_on_asset_or_op_failure"],
    }
    monitoring = INSTANCE["run_monitoring"]
    assert {k: v for k, v in daemon["runMonitoring"].items() if k != "startTimeoutSeconds"} == {
        "enabled": monitoring["enabled"],
        "pollIntervalSeconds": monitoring["poll_interval_seconds"],
        "maxResumeRunAttempts": monitoring["max_resume_run_attempts"],
        "freeSlotsAfterRunEndSeconds": monitoring["free_slots_after_run_end_seconds"],
    }
    assert VALUES["telemetry"] == INSTANCE["telemetry"]


def _leaves(value, path=()):
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _leaves(child, (*path, str(key)))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _leaves(child, (*path, str(index)))
    else:
        yield path, value


def test_the_values_reference_secrets_and_hold_none():
    assert VALUES["global"]["postgresqlSecretName"] and VALUES["generatePostgresqlPasswordSecret"] is False
    for path, value in _leaves(VALUES):
        if any(word in part.lower() for part in path for word in ("password", "secretkey", "token")):
            assert path[-1] in {"postgresqlSecretName", "generatePostgresqlPasswordSecret"}, (path, value)


def _generated_from_header() -> tuple[str, str]:
    text = MANIFEST_FILE.read_text()
    header = text.splitlines()[0]
    command = header.split("`")[1]
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "dagster_project.sglang.k8s_manifest"], header
    return text, argv[3:]


def test_the_committed_fleet_manifest_is_the_generators_output(capsys):
    text, argv = _generated_from_header()
    k8s_manifest.main(argv)
    assert capsys.readouterr().out == text, "deploy/sglang-fleet.yaml is stale: regenerate it with its header's command"


def test_the_fleet_manifest_runs_one_server_per_gpu_with_the_launch_flags_of_fleet_up():
    _, argv = _generated_from_header()
    objects = {obj["kind"]: obj for obj in yaml.safe_load_all(MANIFEST_FILE.read_text())}
    assert set(objects) == {"Service", "StatefulSet", "ConfigMap"}
    for obj in objects.values():
        assert obj["apiVersion"] in {"v1", "apps/v1"} and obj["metadata"]["name"] and obj["metadata"]["namespace"]
    service, statefulset, config = objects["Service"], objects["StatefulSet"], objects["ConfigMap"]
    spec = statefulset["spec"]
    pod_labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"] == pod_labels == service["spec"]["selector"]
    assert spec["serviceName"] == service["metadata"]["name"] and service["spec"]["clusterIP"] == "None"
    (container,) = spec["template"]["spec"]["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 1}
    mounts = {m["name"] for m in container["volumeMounts"]}
    assert mounts <= {v["name"] for v in spec["template"]["spec"]["volumes"]}

    # The command is `fleet up`'s for the GPU the header names: the planned cap, MTP, radix cache off.
    flags = dict(zip(argv[::2], argv[1::2]))
    options = ServerOptions(model_path=flags["--model"], host="0.0.0.0")  # a pod listens beyond loopback
    target = k8s_manifest.CapacityTarget(gpu_memory_gib=float(flags["--gpu-memory-gib"]))
    planned = k8s_manifest.FleetManifest(1, "image", options=options, target=target).launch_options()
    assert (
        planned
        == plan_capacity(
            options,
            target,
            k8s_manifest.capacity.GpuMemory(
                target.gpu_memory_gib + k8s_manifest.capacity.CUDA_CONTEXT_GIB, target.gpu_memory_gib
            ),
        )[0]
    )
    port = container["ports"][0]["containerPort"]
    assert container["command"] + container["args"] == server_command(planned, port, python="python3")
    assert "--max-running-requests" in container["args"] and "--disable-radix-cache" in container["args"]
    assert container["args"][container["args"].index("--host") + 1] == "0.0.0.0"  # reached through the Service
    assert container["startupProbe"]["httpGet"]["path"] == "/health_generate"

    endpoints = config["data"]["DFLASH_SGLANG_ENDPOINTS"].split(",")
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    assert endpoints == [f"http://{name}-{i}.{name}.{namespace}.svc:{port}" for i in range(spec["replicas"])]
    assert spec["replicas"] == int(flags["--servers"])


@pytest.mark.parametrize("secret", [None, "sglang-api-key"])
def test_an_api_key_comes_from_a_secret_and_never_into_the_manifest(secret):
    manifest = k8s_manifest.FleetManifest(2, "image", api_key_secret=secret)
    (container,) = [o for o in manifest.objects() if o["kind"] == "StatefulSet"][0]["spec"]["template"]["spec"][
        "containers"
    ]
    command = container["command"] + container["args"]
    assert "--api-key" not in command and not any("$(SGLANG_API_KEY)" in arg for arg in command)
    if secret is None:
        assert "--config" not in command and container["env"] == []
    else:
        # The shell writes SGLang's --config file (0600) from the variable, then execs the server with it.
        assert command[:2] == ["/bin/sh", "-c"] and "umask 077" in command[2]
        assert command[command.index("--config") + 1] == k8s_manifest.SECRETS_CONFIG
        assert container["env"] == [
            {"name": "SGLANG_API_KEY", "valueFrom": {"secretKeyRef": {"name": secret, "key": "api-key"}}}
        ]


def test_make_dev_gives_run_launches_longer_than_dagsters_default_grpc_deadline():
    """On one node the daemon waits for the code server to start each run, which answers once the run's process
    has imported Dagster: on 2 busy cores past Dagster's 60 s, failing the run. `make dev` and the tests' and
    benchmarks' `dagster dev` wait longer, by the same setting."""
    from dagster._grpc.utils import _DEFAULT_GRPC_TIMEOUT_IF_NO_ENV_VAR_SET

    from tests.support.dagster_helpers import LAUNCH_TIMEOUT_S

    makefile = (PROJECT_ROOT / "Makefile").read_text()
    dev_target = makefile.split("\ndev:", 1)[1].split("\n\n", 1)[0]
    assert "DAGSTER_GRPC_TIMEOUT_SECONDS=$(LAUNCH_TIMEOUT_S) $(BIN)/dagster dev" in dev_target
    assert f"\nLAUNCH_TIMEOUT_S ?= {LAUNCH_TIMEOUT_S}\n" in makefile
    assert int(LAUNCH_TIMEOUT_S) > _DEFAULT_GRPC_TIMEOUT_IF_NO_ENV_VAR_SET


# ---- the supervised head node: deploy/head/ (supervisord) and deploy/systemd/ --------------------------------------

HEAD = DEPLOY / "head"
UNITS = DEPLOY / "systemd"
# supervisord.conf's program -> its systemd unit: the same three processes, each restarted when it dies.
HEAD_UNITS = {"code-server": "dflash-code-server", "daemon": "dflash-daemon", "webserver": "dflash-webserver"}
CHECKOUT = "/opt/dflash/"  # where the units expect the repository (and its .venv)


def _ini(path) -> configparser.ConfigParser:
    # strict=False: a systemd unit may repeat a key (two Environment= lines).
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.read_string(path.read_text())
    return parser


def _supervised_command(program: str) -> list[str]:
    """A program's command with supervisord's %(ENV_X)s and %(here)s written as a unit writes them."""
    command = _ini(HEAD / "supervisord.conf")[f"program:{program}"]["command"]
    command = re.sub(r"%\(ENV_(\w+)\)s", r"${\1}", command).replace("%(here)s", "deploy/head")
    return shlex.split(command)


def _unit_command(unit: str) -> list[str]:
    argv = shlex.split(_ini(UNITS / f"{unit}.service")["Service"]["ExecStart"].replace(CHECKOUT, ""))
    return [argv[0].removeprefix(".venv/bin/"), *argv[1:]]


def test_supervisord_and_systemd_run_the_same_three_commands_each_restarted_when_it_dies():
    supervised = _ini(HEAD / "supervisord.conf")
    assert {s.removeprefix("program:") for s in supervised.sections() if s.startswith("program:")} == set(HEAD_UNITS)
    for program, unit in HEAD_UNITS.items():
        assert _supervised_command(program) == _unit_command(unit), program
        assert supervised[f"program:{program}"]["autorestart"] == "true"
        service = _ini(UNITS / f"{unit}.service")
        assert service["Service"]["Restart"] == "always" and service["Unit"]["StartLimitIntervalSec"] == "0", unit
        assert "dflash-instance-init.service" in service["Unit"]["After"].split(), unit
        assert service["Install"]["WantedBy"] == "dflash-head.target"
    wanted = _ini(UNITS / "dflash-head.target")["Unit"]["Wants"].split()
    assert set(wanted) == {f"{unit}.service" for unit in (*HEAD_UNITS.values(), "dflash-instance-init")}
    # The daemon and the webserver load the location from the code server (a grpc_server entry), not in a child
    # of their own that would die with them; by the name `make dev` gives it.
    workspace = yaml.safe_load((HEAD / "workspace.yaml").read_text())["load_from"]
    assert [set(entry) for entry in workspace] == [{"grpc_server"}]
    assert workspace[0]["grpc_server"]["location_name"] == "dagster_project"
    # The runs the code server launched (its children) outlive its restart: signalled alone by either supervisor.
    assert _ini(UNITS / "dflash-code-server.service")["Service"]["KillMode"] == "process"
    assert not {"stopasgroup", "killasgroup"} & set(supervised["program:code-server"])


def test_the_instance_is_initialised_once_before_the_three_start():
    init = _ini(UNITS / "dflash-instance-init.service")["Service"]
    assert init["Type"] == "oneshot" and init["RemainAfterExit"] == "yes"
    assert _unit_command("dflash-instance-init") == ["dagster", "instance", "migrate"]
    for unit in HEAD_UNITS.values():
        assert "dflash-instance-init.service" in _ini(UNITS / f"{unit}.service")["Unit"]["Requires"].split(), unit
    script = (HEAD / "run-head").read_text()
    assert script.index("\ndagster instance migrate\n") < script.index("\nexec supervisord -c ")


def test_the_head_node_reads_credentials_from_its_environment_file_and_holds_none():
    secret = re.compile(r"(PASSWORD|SECRET|ACCESS_KEY|API_KEY|TOKEN)\w*=\S", re.IGNORECASE)
    for path in [HEAD / "supervisord.conf", HEAD / "run-head", *UNITS.iterdir()]:
        assert not secret.search(path.read_text()), path
    for path in UNITS.glob("*.service"):
        assert _ini(path)["Service"]["EnvironmentFile"] == "/etc/dflash/head.env", path
    # The example the operator copies names the credentials and gives none.
    example = (HEAD / "head.env.example").read_text()
    assert "DAGSTER_PG_PASSWORD=" in example and not secret.search(example)
