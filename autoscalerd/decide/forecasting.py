"""Stage 3: the forecast of the arrival rate over the lead time (cold start + actuation).

Holt-Winters on the request rate (autoscalerd/forecast/holt_winters.py); the sizing uses
the upper bound ŷ + z·σ̂, the most over the horizon.
"""

from __future__ import annotations

from autoscalerd.config import DeploymentConfig
from autoscalerd.forecast import holt_winters
from autoscalerd.forecast.holt_winters import Forecast, ForecasterState


def lead_time_s(cfg: DeploymentConfig) -> float:
    return cfg.capacity.cold_start_s + cfg.capacity.actuation_delay_s


def step(
    forecaster: ForecasterState,
    rate_per_s: float | None,
    tick_s: float,
    cfg: DeploymentConfig,
    now_s: float,
) -> tuple[ForecasterState, Forecast | None]:
    if not cfg.forecast.enabled:
        return forecaster, None
    if rate_per_s is not None:
        forecaster = holt_winters.observe(forecaster, rate_per_s, tick_s, now_s, cfg.forecast)
    return forecaster, holt_winters.forecast(forecaster, lead_time_s(cfg), now_s, cfg.forecast)
