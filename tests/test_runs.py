"""runs.Runs: independent simulations here or in worker processes, results in order."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from autoscalerd.sim.runs import Runs


def _where(offset: int, task: int) -> tuple[int, int]:
    return task + offset, os.getpid()


def _last_first(folder: str, task: int) -> tuple[int, int]:
    """Task 0 waits for the last task to have run: the results come back out of order."""
    mark = Path(folder) / str(task)
    if task == 0:
        deadline = time.monotonic() + 60.0
        while not (Path(folder) / "4").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    mark.touch()
    return task, os.getpid()


def _fails(shared: None, task: int) -> int:
    if task == 2:
        raise ValueError(f"task {task} failed")
    return task


def test_in_this_process_each_task_runs_between_its_start_and_done() -> None:
    events: list[str] = []
    with Runs(_where, 10, jobs=1) as runs:
        found = runs.map(
            [0, 1, 2],
            on_start=lambda task: events.append(f"start {task}"),
            on_done=lambda task, result: events.append(f"done {task} {result[0]}"),
        )
    assert [value for value, _ in found] == [10, 11, 12]
    assert {pid for _, pid in found} == {os.getpid()}
    assert events == ["start 0", "done 0 10", "start 1", "done 1 11", "start 2", "done 2 12"]


def test_workers_return_results_in_the_tasks_order(tmp_path: Path) -> None:
    done: list[int] = []
    with Runs(_last_first, str(tmp_path), jobs=2) as runs:
        found = runs.map(list(range(5)), on_done=lambda task, _: done.append(task))
    assert [task for task, _ in found] == [0, 1, 2, 3, 4]
    # Two workers: one held task 0 while the other ran the rest, which finished first.
    assert done[-1] == 0 and sorted(done) == [0, 1, 2, 3, 4]
    assert len({pid for _, pid in found}) == 2 and os.getpid() not in {p for _, p in found}
    with Runs(_where, 100, jobs=2) as runs:
        assert [value for value, _ in runs.map([3, 4, 5])] == [103, 104, 105]
        # The pool stays up for the next tasks; a single task goes to it as well.
        assert runs.map([7])[0][1] != os.getpid()


def test_a_failing_task_raises_its_own_error_here() -> None:
    with Runs(_fails, None, jobs=2) as runs, pytest.raises(ValueError, match="task 2 failed"):
        runs.map([1, 2, 3])


def test_jobs_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Runs(_fails, None, jobs=0)
