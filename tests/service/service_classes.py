"""The service classes the service tests configure: interactive, agent-burst and a
preemptible opportunistic class with a one-second grace that runs free when broke."""

CLASSES = [
    {"name": "interactive", "rank": 1, "multiplier": 2.0},
    {"name": "agent-burst", "rank": 2, "multiplier": 3.0},
    {"name": "opportunistic", "rank": 3, "multiplier": 0.25, "congestion_priced": False,
     "preemptible": True, "grace": 1.0, "free_when_broke": True},
]
