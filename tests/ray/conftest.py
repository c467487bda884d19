"""The real-Ray test cluster: started once for the tests in this folder, always stopped.

A local autoscaling cluster from config/ray-cluster.yaml (head with 2 CPUs, up to three
logical-GPU worker nodes), token auth on, and two emulator apps:
- `llm`: one-GPU replicas, deployed with external_scaler_enabled (autoscalerd's to scale);
- `plain`: CPU replicas on the head, deployed without it (the 412 case).
"""

from __future__ import annotations

import atexit
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoscalerd.emulator import cluster as local
from tests.ray.ray_helpers import APPS, LLM, scale


# Package scope: the cluster stops when this folder's tests are done, so later tests (the
# demo starts a cluster of its own on the same ports) find the machine free.
@pytest.fixture(scope="package")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local.LocalCluster]:
    workdir = tmp_path_factory.mktemp("ray")
    # Also on an interpreter exit that skips fixture teardown (e.g. a second Ctrl-C).
    atexit.register(local.stop)
    with local.running(workdir, APPS) as cluster:
        yield cluster


@pytest.fixture
def llm_at_one(ray_cluster: local.LocalCluster) -> local.LocalCluster:
    """The llm deployment back at one running replica before the test."""
    scale(ray_cluster, LLM, 1)
    return ray_cluster


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path
