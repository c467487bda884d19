"""The live cost report: replica- and GPU-seconds used so far by each deployment, against
what static provisioning at the peak seen would have used over the same time.

Integrated tick by tick from the platform's running-replica count (the replicas being
paid for, whether or not they serve), times the GPUs one replica asks for.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CostMeter:
    since_s: float | None = None
    last_s: float | None = None
    running: float = 0.0
    gpus_per_replica: float = 0.0
    replica_seconds: float = 0.0
    gpu_seconds: float = 0.0
    peak_replicas: float = 0.0
    peak_gpus_per_replica: float = 0.0

    def update(self, now_s: float, running: float | None, gpus_per_replica: float) -> None:
        """Account the interval since the last update at the count then, then take the
        new count (unknown: the last known one holds, as the replicas still cost)."""
        if self.last_s is not None and now_s > self.last_s:
            interval_s = now_s - self.last_s
            self.replica_seconds += self.running * interval_s
            self.gpu_seconds += self.running * self.gpus_per_replica * interval_s
        if self.since_s is None:
            self.since_s = now_s
        self.last_s = now_s
        if running is not None:
            self.running = running
        self.gpus_per_replica = gpus_per_replica
        self.peak_replicas = max(self.peak_replicas, self.running)
        self.peak_gpus_per_replica = max(self.peak_gpus_per_replica, gpus_per_replica)

    def report(self) -> dict[str, float | None]:
        elapsed_s = 0.0
        if self.last_s is not None and self.since_s is not None:
            elapsed_s = self.last_s - self.since_s
        static_replica_s = self.peak_replicas * elapsed_s
        static_gpu_s = static_replica_s * self.peak_gpus_per_replica
        return {
            "since_s": self.since_s,
            "replica_hours": round(self.replica_seconds / 3600, 4),
            "gpu_hours": round(self.gpu_seconds / 3600, 4),
            "static_peak_replicas": self.peak_replicas,
            "static_peak_replica_hours": round(static_replica_s / 3600, 4),
            "static_peak_gpu_hours": round(static_gpu_s / 3600, 4),
            "saved_ratio": round(1.0 - self.replica_seconds / static_replica_s, 4)
            if static_replica_s > 0
            else None,
        }
