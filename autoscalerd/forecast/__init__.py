"""Arrival-rate forecasting: Holt-Winters with Holt and EWMA fallbacks, plus baselines."""
