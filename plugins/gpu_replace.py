"""Replacing a replica whose GPU failed (`gpu.replace_failed: true`, opt-in).

Serve's scale API sets only a count and Serve chooses which replica to stop: adding one
replica for the lost capacity can leave the failed one serving (badly) and a later
scale-down may stop a healthy one. With this on, the `ray_serve` actuator stops the
failed replica's actor through Ray (`ray.kill(..., no_restart=True)`, namespace
"serve"); Serve's controller then starts a replacement on a healthy GPU. At most one per
deployment per `gpu.replace_every_s`, each logged. Off (the default), the extra replica
stays until the failed one is gone.

The Ray client blocks (and `ray.init` can wait long for an unreachable GCS): calls run
on a worker thread and are never waited for beyond `call_timeout_s`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable

from autoscalerd import logs
from autoscalerd.act.base import Actuation

Kill = Callable[[str], None]


def ray_kill(address: str) -> Kill:
    """Stop the named Serve replica actor through the Ray client at `address`."""

    def kill(actor_name: str) -> None:
        import ray

        if not ray.is_initialized():
            ray.init(
                address=address,
                logging_level=logging.WARNING,
                log_to_driver=False,
                configure_logging=False,
                ignore_reinit_error=True,
            )
        ray.kill(ray.get_actor(actor_name, namespace="serve"), no_restart=True)

    return kill


class ReplicaReplacer:
    def __init__(self, kill: Kill, every_s: float, call_timeout_s: float = 1.5) -> None:
        self._kill = kill
        self._every_s = every_s
        self._timeout_s = call_timeout_s
        self._last_s: dict[str, float] = {}
        self._done: set[str] = set()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="gpu-replace"
        )
        self._log = logs.get("autoscalerd.actuator.gpu_replace")

    async def replace_failed(self, actuation: Actuation, now_s: float) -> str | None:
        """Stop one failed replica of this deployment if one is due; what was done."""
        decision, info = actuation.decision, actuation.info
        failed = [replica for replica, _, state, _ in decision.gpu_replicas if state == "failed"]
        if not failed or info is None:
            return None
        name = decision.deployment
        last_s = self._last_s.get(name)
        if last_s is not None and now_s - last_s < self._every_s:
            return None
        actors = {r.replica_id: r.actor_name for r in info.replicas}
        for replica in failed:
            actor = actors.get(replica)
            if actor is None or actor in self._done:
                continue
            self._last_s[name] = now_s
            self._done.add(actor)
            future = self._executor.submit(self._kill, actor)
            try:
                await asyncio.wait_for(asyncio.wrap_future(future), self._timeout_s)
            except (TimeoutError, asyncio.TimeoutError):
                self._log.warning("replica_replace_pending", deployment=name, replica=replica)
                return f"stopping {replica} (its GPU failed); Ray slow to answer"
            except Exception as exc:
                error = " ".join(str(exc).split())[:160]
                self._log.warning(
                    "replica_replace_failed", deployment=name, replica=replica, error=error
                )
                return f"could not stop {replica}: {error}"
            self._log.warning(
                "replica_replaced",
                deployment=name,
                replica=replica,
                actor=actor,
                reason="its GPU failed",
            )
            return f"stopped {replica} (its GPU failed); Serve starts a replacement"
        return None

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
