"""A real S3-protocol server for tests: moto's S3 in server mode, as its own process on loopback
(tests/support/moto_s3_server.py: moto's S3 app alone, without per-request logging)."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from dagster_project.sglang.launch import free_ports
from tests.support.paths import PROJECT_ROOT

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing-key",
    "AWS_SECRET_ACCESS_KEY": "testing-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen

    @property
    def env(self) -> dict[str, str]:
        """What a client process needs: boto3 (and so dagster-aws S3Resource) reads these itself."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
        )


def _wait_until_up(endpoint: str, process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the S3 server exited with {process.returncode}")
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=1)
            return
        except OSError:
            time.sleep(0.05)  # polling a condition with a deadline, not synchronising by sleep
    raise TimeoutError(f"the S3 server did not answer on {endpoint} within {timeout_s}s")


@contextmanager
def running_s3_server() -> Iterator[S3Server]:
    port = free_ports(1)[0]
    endpoint = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.moto_s3_server", "-H", "127.0.0.1", "-p", str(port)],
        cwd=PROJECT_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_until_up(endpoint, process)
        yield S3Server(endpoint, process)
    finally:
        process.terminate()
        process.wait(timeout=10)
