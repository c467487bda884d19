"""A real Prometheus for the tests in this folder, scraping the local Ray cluster (the
one tests/ray starts, started here again for this folder) and the daemons they run.

Prometheus scrapes every second: Ray's nodes through the head's service-discovery file,
and the job `autoscalerd` through a targets file a test sets to its daemon's address. It
loads the shipped alerting rules, so that they are evaluated against real series too.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from autoscalerd.emulator.cluster import LocalCluster
from tests.helpers import REPO
from tests.prom import prometheus_server as ps
from tests.ray.conftest import llm_at_one, ray_cluster  # noqa: F401 - the fixtures, reused

# Written by Ray's head (ray_serve's default service_discovery_file).
SERVICE_DISCOVERY = "/tmp/ray/prom_metrics_service_discovery.json"
ALERTS = REPO / "config" / "prometheus" / "alerts.yaml"
RAY_JOB = {
    "job_name": "ray",
    "file_sd_configs": [{"files": [SERVICE_DISCOVERY], "refresh_interval": "1s"}],
}


@pytest.fixture(scope="package")
def prometheus(
    ray_cluster: LocalCluster,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ps.PrometheusServer]:
    with ps.running(
        tmp_path_factory.mktemp("prometheus"),
        scrape_configs=[RAY_JOB],
        file_sd_jobs=("autoscalerd",),
        rule_files=(ALERTS,),
    ) as server:
        # Every running replica exports this gauge: Ray is scraped once it is there.
        server.wait_for_series('ray_serve_replica_processing_queries{job="ray"}', 60)
        yield server
