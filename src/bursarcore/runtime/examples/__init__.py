"""Example agents for the runtime (SPEC §13): small programs the tests and docs run.

* :mod:`.counter` — a stateful agent that counts steps, persists its progress, stops
  promptly on SIGTERM and resumes where it stopped (served by the ``counter`` plugin).
"""
