"""Print the fault table at the end of the session."""

from __future__ import annotations

from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from tests.faults.test_faults import ROWS

    if not ROWS:
        return
    write = terminalreporter.write_line
    write("")
    write("fault injection (steady load needs 10 replicas; the platform runs 10)")
    header = f"{'fault':<24} {'phase':<9} {'wrong scale-downs':>17} {'missed scale-ups':>16} "
    write(header + f"{'recovery ticks':>14}  crashed")
    for row in ROWS:
        write(
            f"{row['fault']:<24} {row['phase']:<9} {row['wrong_scale_downs']:>17} "
            f"{row['missed_scale_ups']:>16} {row['recovery_ticks']:>14}  "
            f"{'yes' if row['crashed'] else 'no'}"
        )
