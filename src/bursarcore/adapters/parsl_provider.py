"""``BursarProvider``, the Parsl execution provider on bursar leases — the one module of
bursarcore that imports Parsl (an optional extra). Its logic, launchers and the module
documentation are in :mod:`bursarcore.adapters.parsl`; users import it from there::

    from bursarcore.adapters.parsl import BursarProvider

The class is defined here at module level, so it pickles by reference (Parsl configs are
pickled and deep-copied by tools that ship them to other processes) and type checkers see
a real class.
"""

from __future__ import annotations

from typing import Any

from parsl.providers.base import ExecutionProvider

from .parsl import _Provider

__all__ = ["BursarProvider"]


# (Parsl types status_polling_interval as int seconds; ours is a float, which its poller
# sleeps for just the same)
class BursarProvider(_Provider, ExecutionProvider):  # type: ignore[misc]
    """A Parsl ExecutionProvider where one block is one bursar lease.

    ``BursarProvider(campaign, base_url=..., token=... | broker=..., gpus_per_block=1,
    lease_duration=600, adaptive=True, init_blocks=1, min_blocks=0, max_blocks=1,
    launcher=None)``; see :mod:`bursarcore.adapters.parsl`.
    """

    def __init__(self, campaign: str, **kwargs: Any) -> None:
        _Provider.__init__(self, campaign, **kwargs)
