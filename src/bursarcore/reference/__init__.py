"""The pure-Python reference model: docs/spec.md written as plain, readable code.

It is always importable, whatever the build, and every compiled kernel is tested against it
(same operations, same results, bit for bit).
"""

from .broker import ReferenceBroker
from .buckets import TokenBuckets

__all__ = ["ReferenceBroker", "TokenBuckets"]
