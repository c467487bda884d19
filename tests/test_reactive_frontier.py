"""benchmarks/reactive_frontier.py as a user runs it: the reactive plans it prints hold
what finished minutes needed, so a longer hold never costs less, and bad arguments get
a one-line error and exit code 2."""

from __future__ import annotations

import subprocess

from tests.helpers import run_benchmark


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_benchmark("reactive_frontier", *args)


def test_a_longer_hold_never_costs_less_and_every_row_is_a_share() -> None:
    done = _run("azure-2023-code", "8b-1gpu", "--utilizations", "0.2", "--holds", "0", "300")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("azure-2023-code 8b-1gpu: cold start 30 s, buckets 60 s")
    rows = [line.split() for line in lines[3:]]
    assert [(row[0], row[1]) for row in rows] == [("0.2", "0"), ("0.2", "300")]
    attained = [float(row[2].rstrip("%")) for row in rows]
    cost_s = [float(row[3].replace(",", "")) for row in rows]
    ratio = [float(row[4]) for row in rows]
    assert all(0.0 <= share <= 100.0 for share in attained)
    # Holding each minute's count for five more minutes holds at least as many replicas
    # at every moment: it costs more and serves at least as many requests in time.
    assert cost_s[1] > cost_s[0]
    assert attained[1] >= attained[0]
    assert all(value > 0 for value in ratio)


def test_bad_arguments_get_one_line_and_exit_code_2() -> None:
    for args, flag in (
        (("azure-2023-code", "8b-1gpu", "--utilizations", "1.5"), "--utilizations"),
        (("azure-2023-code", "8b-1gpu", "--holds", "-60"), "--holds"),
    ):
        done = _run(*args)
        assert done.returncode == 2
        assert flag in done.stderr.splitlines()[-1]
        assert "Traceback" not in done.stderr
    done = _run("no-such-trace", "8b-1gpu")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "unknown trace 'no-such-trace'" in done.stderr
