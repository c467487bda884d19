"""Independent simulations, one after another or over worker processes (`--jobs N`).

A backtest is a few dozen simulations of the same trace (each policy, each static count
and each oracle utilisation of the frontiers) that share nothing but their inputs: on a
machine with N cores, N of them run at once. The workers are spawned, not forked (the
caller may hold threads: a progress display), and each receives the shared inputs once,
at start; a task is then a small value (a policy's name, a replica count). Results come
back in the order of the tasks, whatever the order they finish in, so a run with N jobs
gives the same results as a run with one.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from types import TracebackType
from typing import Any, Generic, TypeVar

Shared = TypeVar("Shared")
Task = TypeVar("Task")
Result = TypeVar("Result")

# In a worker: the function and the shared inputs its tasks run with (set at its start).
_worker: tuple[Callable[[Any, Any], Any], Any] | None = None


def _start_worker(execute: Callable[[Any, Any], Any], shared: Any) -> None:
    global _worker
    _worker = (execute, shared)


def _run_in_worker(task: object) -> object:
    assert _worker is not None, "a task reached a worker that was not started"
    execute, shared = _worker
    return execute(shared, task)


class Runs(Generic[Shared, Task, Result]):
    """`execute(shared, task)` for each task: in this process with `jobs` 1, else over
    `jobs` worker processes. `execute` must be a module-level function and `shared`
    picklable where `jobs` > 1. Use as a context manager: the workers end with it."""

    def __init__(
        self, execute: Callable[[Shared, Task], Result], shared: Shared, jobs: int = 1
    ) -> None:
        if jobs < 1:
            raise ValueError(f"jobs must be at least 1, not {jobs}")
        self._execute = execute
        self._shared = shared
        self._jobs = jobs
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> Runs[Shared, Task, Result]:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def map(
        self,
        tasks: Sequence[Task],
        on_start: Callable[[Task], None] | None = None,
        on_done: Callable[[Task, Result], None] | None = None,
    ) -> list[Result]:
        """The results of `tasks`, in their order. `on_start` is told of a task as it is
        handed out (in this process: just before it runs; with workers: all at once),
        `on_done` as it finishes."""
        if self._jobs == 1 or (len(tasks) <= 1 and self._pool is None):
            results = []
            for task in tasks:
                if on_start is not None:
                    on_start(task)
                result = self._execute(self._shared, task)
                if on_done is not None:
                    on_done(task, result)
                results.append(result)
            return results
        pool = self._started()
        futures: dict[Future[object], int] = {}
        for index, task in enumerate(tasks):
            if on_start is not None:
                on_start(task)
            futures[pool.submit(_run_in_worker, task)] = index
        found: list[object] = [None] * len(tasks)
        for future in as_completed(futures):
            index = futures[future]
            found[index] = future.result()
            if on_done is not None:
                on_done(tasks[index], found[index])  # type: ignore[arg-type]
        return found  # type: ignore[return-value]

    def _started(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=self._jobs,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(self._execute, self._shared),
            )
        return self._pool
