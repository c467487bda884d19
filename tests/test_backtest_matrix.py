"""benchmarks/backtest_matrix.py's reference cache: a cell rerun on a cached reference
prints what a full run prints, so does one whose reference ran in a second process, and
the cache is keyed on everything the reference runs."""

from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from autoscalerd.config import DeploymentConfig, load_config
from autoscalerd.sim.backtest import BacktestSettings, run_backtest
from autoscalerd.sim.traces import TraceWindow
from tests.helpers import benchmark_module

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "data" / "traces"
# Ten minutes of the Azure 2023 code trace: its first clumps, a few seconds a run.
WINDOW = TraceWindow(duration_s=600.0)


bm = benchmark_module("backtest_matrix")


def _cell(preset: str = "8b-1gpu") -> tuple[DeploymentConfig, BacktestSettings]:
    config = load_config(ROOT / "config" / "backtest.yaml")
    base = config.deployments[0] if config.deployments else config.deployment("llm/backtest")
    replica = bm.MODELS[preset]
    cfg = base.model_copy(
        update={
            "capacity": base.capacity.model_copy(
                update={"cold_start_s": replica.cold_start_s, "sizing": "model"}
            )
        }
    )
    return cfg, BacktestSettings(replica=replica)


def _run(
    cfg: DeploymentConfig,
    settings: BacktestSettings,
    cache: Path | None,
    pool: ProcessPoolExecutor | None = None,
) -> Any:
    return bm.run_one(
        "azure-2023-code",
        TRACES / "azure_llm_2023_code.csv",
        WINDOW,
        "own",
        cfg,
        settings,
        TRACES,
        cache=cache,
        pool=pool,
    )


def test_a_cached_reference_gives_the_full_runs_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, settings = _cell()
    full, _ = _run(cfg, settings, None)
    cache = tmp_path / "references"
    stored, _ = _run(cfg, settings, cache)
    assert stored == full
    assert len(list(cache.glob("*.pickle"))) == 1

    runs: list[list[str]] = []

    def spy(trace: Any, policies: list[str], *args: Any, **kwargs: Any) -> Any:
        runs.append(list(policies))
        return run_backtest(trace, policies, *args, **kwargs)

    monkeypatch.setattr(bm, "run_backtest", spy)
    reused, reference = _run(cfg, settings, cache)
    # The peers and the frontiers came from the cache: autoscalerd alone was simulated.
    assert runs == [["autoscalerd"]]
    assert reference.static_frontier and any(r.policy == "hpa" for r in reference.rows)
    assert reference.series == {}  # stored without the per-tick series
    assert reused == full


def test_a_reference_computed_in_a_second_process_gives_the_full_runs_row(
    tmp_path: Path,
) -> None:
    cfg, settings = _cell()
    full, _ = _run(cfg, settings, None)
    cache = tmp_path / "references"
    with ProcessPoolExecutor(max_workers=1) as pool:
        split, reference = _run(cfg, settings, cache, pool)
    assert split == full
    # The pool's reference holds the peers and the frontiers, not autoscalerd, and it is
    # stored: a later run takes it from the cache and prints the same row.
    assert {r.policy for r in reference.rows} >= {"ray-serve", "hpa", "kpa"}
    assert all(r.policy != "autoscalerd" for r in reference.rows)
    assert reference.static_frontier and reference.oracle_frontier
    assert len(list(cache.glob("*.pickle"))) == 1
    again, _ = _run(cfg, settings, cache)
    assert again == full


def test_the_key_follows_the_settings_and_a_bad_file_is_recomputed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, settings = _cell()
    key = bm.reference_key(TRACES / "azure_llm_2023_code.csv", WINDOW, "own", cfg, settings, TRACES)
    _, other_settings = _cell("70b-4gpu")
    assert key != bm.reference_key(
        TRACES / "azure_llm_2023_code.csv", WINDOW, "own", cfg, other_settings, TRACES
    )
    bounded = cfg.model_copy(
        update={"autoscaling": cfg.autoscaling.model_copy(update={"max_replicas": 3})}
    )
    assert key != bm.reference_key(
        TRACES / "azure_llm_2023_code.csv", WINDOW, "own", bounded, settings, TRACES
    )
    assert key != bm.reference_key(
        TRACES / "azure_llm_2023_code.csv",
        TraceWindow(duration_s=300.0),
        "own",
        cfg,
        settings,
        TRACES,
    )
    cache = tmp_path / "references"
    cache.mkdir()
    (cache / f"{key}.pickle").write_bytes(b"not a pickle")
    assert bm.cached_reference(cache, key) is None
    assert "unreadable" in capsys.readouterr().err
    (cache / f"{key}.pickle").write_bytes(b"\x80\x04K\x01.")  # a pickled int
    assert bm.cached_reference(cache, key) is None


def test_the_peers_and_frontiers_run_only_the_reference_sources() -> None:
    """What a reference computes (the peers, static peak, the oracle, both frontiers)
    runs code from REFERENCE_SOURCES only, so a change anywhere else (autoscalerd's own
    decisions) leaves a cached reference valid."""
    cfg, settings = _cell()
    trace = bm.open_cell(TRACES / "azure_llm_2023_code.csv", WINDOW, "own", TRACES)
    package = ROOT / "autoscalerd"
    ran: set[str] = set()

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        if event == "call":
            ran.add(frame.f_code.co_filename)

    sys.setprofile(profile)
    try:
        run_backtest(trace, bm.PEERS[1:], cfg, settings)
    finally:
        sys.setprofile(None)
    ours = {
        str(Path(f).resolve().relative_to(ROOT))
        for f in ran
        if Path(f).resolve().is_relative_to(package)
    }
    assert ours, "the profile saw no autoscalerd code"
    outside = sorted(
        f for f in ours if not any(f == s or f.startswith(s + "/") for s in bm.REFERENCE_SOURCES)
    )
    assert outside == []
