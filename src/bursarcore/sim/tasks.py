"""Task sets of the science agents: value, GPUs, compute seconds, I/O and inference per task.

A task on ``gpus`` GPUs first needs ``tokens`` of inference (the agent reasons about it),
then reads ``io`` GB from the shared filesystem (staging), then computes for ``seconds``
on its GPUs. Its ``value`` counts as science when it completes. Values are per GPU-second
lognormal, so some tasks are worth far more than others per GPU-second and per GB — the
room an adaptive agent has to choose. Drawn from the scenario seed (and the task set's
``seed_offset``), so two agents naming the same task set get identical tasks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["TaskSet", "make_taskset"]


@dataclass(frozen=True)
class TaskSet:
    arrival: np.ndarray   # s, sorted
    gpus: np.ndarray      # int64
    seconds: np.ndarray   # compute seconds once staged
    io: np.ndarray        # GB to read before computing
    tokens: np.ndarray    # inference tokens before staging
    value: np.ndarray     # science units on completion

    def __len__(self) -> int:
        return int(self.arrival.shape[0])

    @property
    def gpu_seconds(self) -> np.ndarray:
        return self.gpus * self.seconds


def make_taskset(params: dict, seed: int) -> TaskSet:
    rng = np.random.default_rng([int(seed) & ((1 << 63) - 1), 0x7A5C, int(params["seed_offset"]) + 1])
    n = int(params["count"])
    arrival = np.sort(rng.uniform(0.0, params["arrival_window"], n))
    w = np.asarray(params["gpu_weights"], float)
    gpus = np.asarray(params["gpus"], np.int64)[rng.choice(len(w), size=n, p=w / w.sum())]
    seconds = np.round(params["seconds_median"] * rng.lognormal(0.0, params["seconds_sigma"], n),
                       1)
    seconds = np.maximum(seconds, 1.0)
    gs = gpus * seconds
    io = np.round(gs * params["io_per_gpu_second"] * rng.lognormal(0.0, params["io_sigma"], n), 3)
    tokens = np.round(params["tokens_median"] * rng.lognormal(0.0, params["tokens_sigma"], n))
    value = gs / 1000.0 * rng.lognormal(0.0, params["value_sigma"], n)
    return TaskSet(arrival=arrival, gpus=gpus, seconds=seconds, io=io, tokens=tokens,
                   value=np.round(value, 4))
