"""Typing stub of the result objects ``_acquire.FastAcquire`` builds at the C level (the
module's names are private: it has no public interface)."""
