"""Serve's REST API as a sensor keeps it: the last applications answer, when, and why not.

Both Ray sensors read the platform the same way, whatever they read load from: the
deployments, their replicas and the platform's current target come from
`GET /api/serve/applications/` on the dashboard, and while that does not answer every
field is unknown (load without the platform's view cannot safely mean "no traffic").
"""

from __future__ import annotations

from collections.abc import Callable

from autoscalerd.config import ClusterConfig
from autoscalerd.dashboard import DashboardClient, DashboardError, find_token
from autoscalerd.decide.gpu_health import GpuReading
from autoscalerd.model import Observation
from autoscalerd.sense.base import SenseResult
from autoscalerd.sense.problems import ProblemLog
from autoscalerd.sense.serve_api import ServeDeployment, ServeState, ShapeError, parse_applications
from autoscalerd.sense.serve_readings import deployment_info

APPLICATIONS_PATH = "/api/serve/applications/"


def dashboard_client(cluster: ClusterConfig, max_concurrency: int) -> DashboardClient:
    """The dashboard at `cluster.dashboard_url`, with `cluster`'s token (asked for before
    each request, so a rotated token file is picked up)."""
    return DashboardClient(
        cluster.dashboard_url,
        lambda: find_token(cluster),
        timeout_s=cluster.request_timeout_s,
        max_concurrency=max_concurrency,
    )


class ServePlatform:
    def __init__(
        self,
        client: DashboardClient,
        dashboard_url: str,
        sensor: str,
        wall_clock: Callable[[], float],
        problems: ProblemLog,
    ) -> None:
        self._client = client
        self._dashboard_url = dashboard_url
        self._sensor = sensor
        self._wall = wall_clock
        self._problems = problems
        # The last answer, when it was fetched, and the error of the last round (if any).
        self.state: ServeState | None = None
        self.state_at_s: float | None = None
        self.error: str | None = None

    async def fetch(self) -> tuple[ServeState, float] | str:
        """The applications now and when they were fetched, or one line saying why not."""
        try:
            body = await self._client.get_json(APPLICATIONS_PATH)
            fetched_at_s = self._wall()
            state = parse_applications(body)
            self._problems.report(
                "applications",
                f"{len(state.skipped)} entries not in Serve's shape, left out: "
                + "; ".join(state.skipped[:3])
                if state.skipped
                else "",
            )
            return state, fetched_at_s
        except DashboardError as exc:
            return str(exc)
        except ShapeError as exc:
            return f"dashboard {self._dashboard_url}{APPLICATIONS_PATH}: {exc}"

    def keep(self, answer: tuple[ServeState, float] | str) -> ServeState | None:
        """Record a fetch's answer; the state when it is one."""
        if isinstance(answer, str):
            # Reported through SenseResult.error: the loop logs it once per change.
            self.error = answer
            return None
        self.state, self.state_at_s = answer
        self.error = None
        return self.state

    def failed(self, exc: Exception) -> None:
        """A round that raised: the sensor reports it as failed until a round succeeds."""
        self.error = f"{self._sensor} sensor: {type(exc).__name__}: {exc}"

    def result(
        self,
        observe: Callable[[ServeDeployment, float], Observation],
        load_error: str | None,
        gpus: tuple[GpuReading, ...] = (),
    ) -> SenseResult:
        """Every known deployment with `observe(deployment, state_at_s)`; all unknown while
        the platform does not answer. `load_error` fails the sensor for the tick."""
        state = self.state
        if state is None:
            error = self.error or (
                f"{self._sensor} sensor: no answer yet from {self._dashboard_url}"
            )
            return SenseResult({}, {}, error=error)
        state_at_s = self.state_at_s if self.state_at_s is not None else self._wall()
        infos = {
            name: deployment_info(dep, state_at_s, state.controller_id)
            for name, dep in state.deployments.items()
        }
        if self.error is not None:
            unknown = {
                name: Observation(deployment=name, sensed_at_s=self._wall()) for name in infos
            }
            return SenseResult(unknown, infos, error=self.error)
        observations = {name: observe(dep, state_at_s) for name, dep in state.deployments.items()}
        return SenseResult(observations, infos, error=load_error, gpus=gpus)
