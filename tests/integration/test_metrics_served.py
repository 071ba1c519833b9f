"""`dflash metrics`' HTTP side, in process on a loopback port: each scrape reads a fresh status and serves its text;
a scrape whose read fails answers 500, so Prometheus marks the target down instead of keeping old figures."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from dagster_project.ops.metrics import render_metrics, serve_metrics
from dagster_project.store.storage import StoreError
from tests.support.full_status import full_status


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def test_each_scrape_serves_a_fresh_status_and_a_failed_read_answers_500(tmp_path):
    statuses = [full_status(tmp_path), full_status(tmp_path, priced=False)]
    reads: list[int] = []

    def read():
        reads.append(len(reads))
        if len(reads) > len(statuses):
            raise StoreError("the store is unreachable")
        return statuses[len(reads) - 1]

    server, thread = serve_metrics(read, "127.0.0.1", 0)
    try:
        port = server.server_port
        assert [scrape(port), scrape(port)] == [render_metrics(status) for status in statuses]
        with pytest.raises(urllib.error.HTTPError) as failed:
            scrape(port)
        assert failed.value.code == 500
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert len(reads) == 3  # one read per scrape, none at registration
