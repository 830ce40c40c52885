"""Handles on a test queue: the one that creates it, and peers opening it as other workers
would (each its own :class:`TaskQueue`, as in another process), all on one manual clock."""

from __future__ import annotations

from bursarcore.runtime import QueueConfig, TaskQueue


def make(qdir, clock, worker="w0", **cfg):
    """Create the queue at ``qdir`` with fcntl locks (settings ``cfg``) and open it."""
    return TaskQueue.create(qdir, QueueConfig(**cfg), lock="fcntl", clock=clock, worker=worker)


def peer(q, clock, worker):
    """Another worker's handle on ``q``'s queue."""
    return TaskQueue(q.root, clock=clock, worker=worker)
