"""Kubernetes objects for the SGLang fleet: one server per GPU, with exactly the launch `dflash fleet up` makes.

A StatefulSet of single-GPU pods (`nvidia.com/gpu: 1` each; the scheduler spreads them over the GPU nodes),
each running `server_command` with the capacity plan `fleet up` would compute for the GPU's memory; a headless
Service giving every server a stable name (`sglang-3.sglang`); and a ConfigMap with
`DFLASH_SGLANG_ENDPOINTS` naming them all, which the Dagster pods read (deploy/helm/values.yaml).

    python -m dagster_project.sglang.k8s_manifest --servers 16 --image registry.example.com/dflash/sglang:0.5.23 \\
        --namespace dflash --model /models/Qwen3.6-27B --gpu-memory-gib 139 > deploy/sglang-fleet.yaml
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import yaml

from dagster_project.sglang import capacity
from dagster_project.sglang.launch import EVERY_INTERFACE, ServerOptions, server_command
from dagster_project.sglang.launch_plan import CapacityTarget, plan_capacity

NAME = "sglang"
PORT = 30000
ENDPOINTS_CONFIGMAP = "dflash-fleet"
MODEL_CLAIM = "models"  # a PersistentVolumeClaim holding the checkpoint, mounted at /models
# Loading 27B of weights and capturing CUDA graphs takes minutes: the startup probe allows 30.
STARTUP_PROBE_MINUTES = 30
# With an API key, the container's shell writes SGLang's --config file from the Secret's variable (umask 077: only
# the server's user reads it) and then becomes the server: the key is in no process's command line.
SECRETS_CONFIG = "/tmp/sglang-secrets.yaml"
_WRITE_SECRETS_THEN_SERVE = (
    "umask 077 && python3 -c 'import os, sys, yaml; "
    'yaml.safe_dump({"api-key": os.environ["SGLANG_API_KEY"]}, open(sys.argv[1], "w"))\' '
    f'{SECRETS_CONFIG} && exec "$@"'
)


class _PlainDumper(yaml.SafeDumper):
    """Shared values written out in full: anchors and aliases are legal YAML but hard to review."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


@dataclass(frozen=True)
class FleetManifest:
    servers: int
    image: str
    namespace: str = "dflash"
    options: ServerOptions = ServerOptions(model_path="/models/Qwen3.6-27B")
    target: CapacityTarget = CapacityTarget(gpu_memory_gib=139.0)
    # A Secret whose key `api-key` the servers then require (SGLang's `api_key`); the Dagster pods need the same
    # value as SGLANG_API_KEY. None: no key (the servers are reachable inside the cluster only).
    api_key_secret: str | None = None

    def launch_options(self) -> ServerOptions:
        """The options `fleet up` launches with on such a GPU: planned unless sized by hand. An API key is the
        container's own variable (`container_command`), so no key is written into the manifest."""
        gpu = None
        if self.target.gpu_memory_gib is not None:
            free = self.target.gpu_memory_gib
            gpu = capacity.GpuMemory(free + capacity.CUDA_CONTEXT_GIB, free)
        planned, _ = plan_capacity(self.options, self.target, gpu)
        # A pod is reached at its own address through the Service: its server listens beyond loopback, explicitly.
        return replace(planned, api_key=None, host=EVERY_INTERFACE)

    def container_command(self) -> list[str]:
        """The server's command line; with an API key, behind the shell line that writes its --config file."""
        if not self.api_key_secret:
            return server_command(self.launch_options(), PORT, python="python3")
        command = server_command(self.launch_options(), PORT, python="python3", config_file=SECRETS_CONFIG)
        return ["/bin/sh", "-c", _WRITE_SECRETS_THEN_SERVE, NAME, *command]

    def endpoints(self) -> list[str]:
        return [f"http://{NAME}-{i}.{NAME}.{self.namespace}.svc:{PORT}" for i in range(self.servers)]

    def objects(self) -> list[dict[str, Any]]:
        labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "dflash"}

        def metadata(name: str = NAME) -> dict[str, Any]:
            return {"name": name, "namespace": self.namespace, "labels": labels}

        command = self.container_command()
        health = {"httpGet": {"path": "/health_generate", "port": PORT}}
        container = {
            "name": NAME,
            "image": self.image,
            "command": command[:1],
            "args": command[1:],
            "ports": [{"name": "http", "containerPort": PORT}],
            "env": [
                {"name": "SGLANG_API_KEY", "valueFrom": {"secretKeyRef": {"name": secret, "key": "api-key"}}}
                for secret in [self.api_key_secret]
                if secret
            ],
            "resources": {"limits": {"nvidia.com/gpu": 1}},
            "startupProbe": {**health, "periodSeconds": 10, "failureThreshold": STARTUP_PROBE_MINUTES * 6},
            "readinessProbe": {**health, "periodSeconds": 10, "timeoutSeconds": 30, "failureThreshold": 3},
            "volumeMounts": [
                {"name": "models", "mountPath": "/models", "readOnly": True},
                {"name": "shm", "mountPath": "/dev/shm"},
            ],
        }
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata(),
            "spec": {"clusterIP": "None", "selector": labels, "ports": [{"name": "http", "port": PORT}]},
        }
        statefulset = {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": metadata(),
            "spec": {
                "serviceName": NAME,
                "replicas": self.servers,
                "podManagementPolicy": "Parallel",  # every GPU loads its weights at once
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [container],
                        "volumes": [
                            {"name": "models", "persistentVolumeClaim": {"claimName": MODEL_CLAIM, "readOnly": True}},
                            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
                        ],
                    },
                },
            },
        }
        endpoints = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata(ENDPOINTS_CONFIGMAP),
            "data": {"DFLASH_SGLANG_ENDPOINTS": ",".join(self.endpoints())},
        }
        return [service, statefulset, endpoints]

    def render(self) -> str:
        flags = [
            f"--servers {self.servers}",
            f"--image {self.image}",
            f"--namespace {self.namespace}",
            f"--model {self.options.model_path}",
            f"--gpu-memory-gib {self.target.gpu_memory_gib:g}",
        ]
        if self.options.max_running_requests is not None:
            flags.append(f"--max-running-requests {self.options.max_running_requests}")
        if self.api_key_secret:
            flags.append(f"--api-key-secret {self.api_key_secret}")
        command = f"python -m dagster_project.sglang.k8s_manifest {' '.join(flags)}"
        header = f"# Generated by `{command}`; regenerate, never edit.\n"
        return header + yaml.dump_all(self.objects(), Dumper=_PlainDumper, sort_keys=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, required=True, help="SGLang servers: one per GPU")
    parser.add_argument("--image", required=True, help="container image with sglang 0.5.23")
    parser.add_argument("--namespace", default="dflash")
    parser.add_argument("--model", default="/models/Qwen3.6-27B", help="checkpoint path inside the pod")
    parser.add_argument("--gpu-memory-gib", type=float, default=139.0, help="GiB free per GPU before start")
    parser.add_argument("--max-running-requests", type=int, help="size by hand (nothing planned)")
    parser.add_argument("--api-key-secret", help="Secret (key `api-key`) whose value the servers require")
    args = parser.parse_args(argv)
    manifest = FleetManifest(
        args.servers,
        args.image,
        args.namespace,
        ServerOptions(model_path=args.model, max_running_requests=args.max_running_requests),
        CapacityTarget(gpu_memory_gib=args.gpu_memory_gib),
        args.api_key_secret,
    )
    sys.stdout.write(manifest.render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
