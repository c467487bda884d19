"""Serve's and the nodes' JSON: any value is a ServeState and endpoints that can be fetched,
or one ShapeError; one bad entry never costs the others."""

from __future__ import annotations

import contextlib
import math

from hypothesis import given
from hypothesis import strategies as st

from autoscalerd.sense.serve_api import (
    ShapeError,
    parse_applications,
    parse_metrics_targets,
    parse_service_discovery,
)
from tests.fuzz import budget
from tests.fuzz.mutations import Mutator
from tests.fuzz.strategies import NUMBERS, TEXT, json_values, maybe, mutants
from tests.fuzz.targets import TARGETS, check_serve_body, check_serve_state, check_url

TARGET = TARGETS["serve_api"]
MUTATOR = Mutator(TARGET.seeds(), TARGET.structure)
KEYS = st.one_of(
    TEXT,
    st.sampled_from(
        [
            "applications", "deployments", "replicas", "state", "replica_id", "worker_id",
            "node_id", "target_num_replicas", "required_resources", "deployment_config",
            "max_ongoing_requests", "ray_actor_options", "resources", "num_cpus", "num_gpus",
            "memory", "external_scaler_enabled", "deployment_topology", "ingress_deployment",
            "controller_info", "actor_id", "data", "summary", "raylet", "nodeId",
            "nodeManagerAddress", "metricsExportPort", "targets", "labels",
        ]
    ),
)  # fmt: skip
VALUES = json_values(KEYS)
STATES = st.sampled_from(["RUNNING", "STARTING", "UPDATING", "RECOVERING", "STOPPING", ""])
ADDRESSES = st.one_of(
    st.sampled_from(["10.0.0.1", "2001:db8::1", "node-1.example", "::", "[::1]", "a b", "h/x"]),
    TEXT,
)

REPLICA = st.fixed_dictionaries(
    {},
    optional={
        "state": maybe(STATES, KEYS),
        "replica_id": maybe(TEXT, KEYS),
        "worker_id": maybe(TEXT, KEYS),
        "node_id": maybe(TEXT, KEYS),
    },
)
RESOURCES = st.dictionaries(st.sampled_from(["CPU", "GPU", "memory", "x"]) | TEXT, NUMBERS)
DEPLOYMENT = st.fixed_dictionaries(
    {},
    optional={
        "target_num_replicas": maybe(NUMBERS, KEYS),
        "required_resources": maybe(RESOURCES, KEYS),
        "deployment_config": maybe(
            st.fixed_dictionaries(
                {},
                optional={
                    "max_ongoing_requests": maybe(NUMBERS, KEYS),
                    "ray_actor_options": maybe(
                        st.fixed_dictionaries(
                            {},
                            optional={
                                "num_cpus": maybe(NUMBERS, KEYS),
                                "num_gpus": maybe(NUMBERS, KEYS),
                                "memory": maybe(NUMBERS, KEYS),
                                "resources": maybe(RESOURCES, KEYS),
                            },
                        ),
                        KEYS,
                    ),
                },
            ),
            KEYS,
        ),
        "replicas": maybe(st.lists(REPLICA, max_size=4), KEYS),
    },
)
APPLICATIONS = st.fixed_dictionaries(
    {
        "applications": maybe(
            st.dictionaries(
                TEXT,
                maybe(
                    st.fixed_dictionaries(
                        {
                            "deployments": maybe(
                                st.dictionaries(TEXT, maybe(DEPLOYMENT, KEYS), max_size=3),
                                KEYS,
                            )
                        },
                        optional={
                            "external_scaler_enabled": maybe(st.booleans(), KEYS),
                            "deployment_topology": maybe(
                                st.fixed_dictionaries({"ingress_deployment": maybe(TEXT, KEYS)}),
                                KEYS,
                            ),
                        },
                    ),
                    KEYS,
                ),
                max_size=3,
            ),
            KEYS,
        )
    },
    optional={"controller_info": maybe(st.fixed_dictionaries({"actor_id": maybe(TEXT, KEYS)}))},
)
NODES = st.fixed_dictionaries(
    {
        "data": maybe(
            st.fixed_dictionaries(
                {
                    "summary": maybe(
                        st.lists(
                            maybe(
                                st.fixed_dictionaries(
                                    {
                                        "raylet": maybe(
                                            st.fixed_dictionaries(
                                                {
                                                    "state": maybe(st.just("ALIVE"), KEYS),
                                                    "nodeManagerAddress": maybe(ADDRESSES, KEYS),
                                                    "metricsExportPort": maybe(
                                                        st.integers(-2, 70_000) | NUMBERS, KEYS
                                                    ),
                                                },
                                                optional={"nodeId": maybe(TEXT, KEYS)},
                                            ),
                                            KEYS,
                                        )
                                    }
                                ),
                                KEYS,
                            ),
                            max_size=4,
                        ),
                        KEYS,
                    )
                }
            ),
            KEYS,
        )
    }
)
SD_ADDRESS = st.one_of(
    st.builds(lambda host, port: f"{host}:{port}", ADDRESSES, st.integers(-1, 70_000)),
    st.builds(lambda host, port: f"[{host}]:{port}", ADDRESSES, st.integers(-1, 70_000)),
    ADDRESSES,
)
SERVICE_DISCOVERY = st.lists(
    maybe(st.fixed_dictionaries({"targets": maybe(st.lists(maybe(SD_ADDRESS), max_size=4))})),
    max_size=4,
)


@budget.fuzz(budget.MUTANTS)
@given(mutants(MUTATOR))
def test_mutants_of_real_answers_parse_or_are_one_shape_error(data: bytes) -> None:
    TARGET.outcome(data, budget.CPU_LIMIT_S)


@budget.fuzz(budget.BUILT)
@given(st.one_of(APPLICATIONS, NODES, SERVICE_DISCOVERY, VALUES))
def test_any_json_value_parses_or_is_one_shape_error(body: object) -> None:
    with contextlib.suppress(ShapeError):  # all three refused it, each in one line
        check_serve_body(body)


# ---------------------------------------------------------------- found by fuzzing


def _applications(dep: dict[str, object]) -> dict[str, object]:
    return {"applications": {"llm": {"deployments": {"Dep": dep}}}}


def test_actor_resources_not_a_mapping_are_none_not_a_crash() -> None:
    for resources in ([1, 2], "ab", 5, [["GPU", 1]]):
        dep = {"deployment_config": {"ray_actor_options": {"num_gpus": 1, "resources": resources}}}
        found = parse_applications(_applications(dep))
        check_serve_state(found)
        assert found.deployments["llm/Dep"].resources_per_replica == {"CPU": 1.0, "GPU": 1.0}


def test_numbers_beyond_float_are_unknown() -> None:
    huge = 10**400
    dep = {
        "target_num_replicas": huge,
        "required_resources": {"GPU": huge, "CPU": 2},
        "deployment_config": {"max_ongoing_requests": huge},
    }
    found = parse_applications(_applications(dep)).deployments["llm/Dep"]
    assert found.target_replicas is None and found.max_ongoing_requests is None
    assert found.resources_per_replica == {"CPU": 2.0}
    options = {"ray_actor_options": {"num_cpus": huge, "num_gpus": math.inf, "memory": huge}}
    found = parse_applications(_applications({"deployment_config": options})).deployments["llm/Dep"]
    assert found.resources_per_replica == {}


def test_a_node_whose_port_or_address_makes_no_url_is_not_scraped() -> None:
    nodes = [
        ("10.0.0.1", 8080, "http://10.0.0.1:8080/metrics"),
        ("2001:db8::1", 8080, "http://[2001:db8::1]:8080/metrics"),
        ("10.0.0.2", True, None),
        ("10.0.0.3", 4294967296, None),
        ("10.0.0.4", 8080.0, None),
        ("h/x", 80, None),
        ("x@y", 80, None),
        ("a b", 80, None),
        ("h\nx", 80, None),
        ("[::1]", 80, None),
        ("g::1", 80, None),
        (5, 80, None),
    ]
    body = {
        "data": {
            "summary": [
                {"raylet": {"state": "ALIVE", "nodeManagerAddress": a, "metricsExportPort": p}}
                for a, p, _ in nodes
            ]
        }
    }
    urls = [t.url for t in parse_metrics_targets(body)]
    assert urls == [url for _, _, url in nodes if url is not None]
    files = parse_service_discovery(
        [
            {
                "targets": [
                    "10.0.0.1:8080",
                    "[2001:db8::1]:9090",
                    "ray",
                    "10.0.0.2:99999",
                    "h:abc",
                    "[::1",
                    "h:1:2",
                    "\u00e9:80",
                    "a b:80",
                ]
            }
        ]
    )
    for target in files:
        check_url(target)
    assert [t.url for t in files] == [
        "http://10.0.0.1:8080/metrics",
        "http://[2001:db8::1]:9090/metrics",
        "http://ray:80/metrics",
    ]
