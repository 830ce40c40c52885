"""The admission rules of docs/spec.md as plain functions of named numbers.

Every quantity is an integer in the units of SPEC §2: time in ns, held tokens in unit·ns,
credits in micro-credits, multipliers in parts per million. Python ints do not overflow,
so these functions need no 128-bit care.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .leases import Campaign, Dimension

NS = 1_000_000_000
HOUR_NS = 3600 * NS
PPM = 1_000_000
CREDIT = 1_000_000                  # micro-credits per credit
UNLIMITED = 1 << 62                 # SPEC §2: the sentinel of credits=inf and burst=inf
BIG = UNLIMITED                     # "no limit" for a rule that does not bind

# reason codes, in the order and spelling of the journal's reason column (SPEC §4.4)
REASONS = ("", "capacity", "tokens", "credits", "ceiling", "deadline", "ttl", "invalid",
           "unknown_campaign", "cancelled", "pending_limit")
# the rules with a limit, in the order a refusal names them (SPEC §4.4); each one, when it
# binds, is decided as the reason of its name
LIMIT_RULES = ("ceiling", "capacity", "tokens", "credits")
OK, CAPACITY, TOKENS, CREDITS, CEILING, DEADLINE, TTL, INVALID = range(8)
CANCELLED, PENDING_LIMIT = 9, 10
WARM, RECLAIM, COLD = 0, 1, 2
PATHS = ("warm", "reclaim", "cold", "borrow")


def wrap(x: int) -> int:
    """SPEC §2: cumulative counters (credits spent and refunded, an unlimited budget's
    escrow) are kept modulo 2**64 as signed int64, identically in every backend."""
    return ((x + (1 << 63)) & ((1 << 64) - 1)) - (1 << 63)


def excess(H: int, n: int, s: int) -> int:
    """SPEC §4.2: of n units added at holding H, those above the sustained rate s.
    Only they are prepaid: excess(n, H) · d tokens. (In a tree, SPEC §14.2, H is a node's
    load and n the grant's rise of it.)"""
    return max(0, H + n - s) - max(0, H - s)


def lease_cost(n: int, dur: int, price: int) -> int:
    """SPEC §4.3: n units for dur ns at ``price`` micro-credits per unit-hour, rounded up
    to a micro-credit."""
    return -(-(n * dur * price) // HOUR_NS)


@dataclass(frozen=True)
class ClassTerms:
    """One service class in engine units (SPEC §7)."""
    name: str
    rank: int
    mult: int               # the credit multiplier, ppm
    priced: bool            # congestion-priced
    preemptible: bool
    grace: int              # ns
    free_when_broke: bool


@dataclass(frozen=True)
class Limits:
    """The most units each rule lets one more lease have (SPEC §4.4), and its price.

    ``by_rule``: each rule of :data:`LIMIT_RULES`, in that order, with its limit (the
    capacity rule counts units a reclaim could reach); ``warm``: the units free now."""
    by_rule: dict[str, int]
    warm: int
    price: int              # micro-credits per unit-hour, the class and congestion applied

    def __post_init__(self) -> None:
        assert tuple(self.by_rule) == LIMIT_RULES, tuple(self.by_rule)

    @property
    def capacity(self) -> int:
        return self.by_rule["capacity"]

    def size(self, nmax: int) -> int:
        """SPEC §4.4: the largest n <= nmax every rule allows (0 if none)."""
        return max(0, min(nmax, *self.by_rule.values()))

    def binding(self, n: int) -> int:
        """SPEC §4.4: the first rule, in the order of :data:`LIMIT_RULES`, whose limit is
        what held the size to n."""
        for name, lim in self.by_rule.items():
            if lim <= n:
                return REASONS.index(name)
        return OK

    def tightest(self) -> int:
        """SPEC §4.4: the rule that binds a pending intent: the first at the smallest limit."""
        return self.binding(max(0, min(self.by_rule.values())))

    def first_broken(self, n: int) -> int:
        """SPEC §8: the first rule, in the same order, that a request of exactly n breaks."""
        for name, lim in self.by_rule.items():
            if lim < n:
                return REASONS.index(name)
        return OK


def limits(path: list[Campaign], d: int, dim: Dimension, cls: ClassTerms, dur: int,
           spend: int | None, price: int, instant: bool, firm: int,
           absorbed: list[int], borrow: tuple[int, int] | None = None) -> Limits:
    """What each rule allows one more lease of the campaign ``path[0]`` (of class cls, on
    dimension dim, index d) for dur ns at ``price`` (SPEC §4.1–§4.4). ``path`` is the
    campaign and its ancestors (SPEC §14): the ceiling, the bucket and the budget of every
    one of them must admit the lease, so each rule's limit is the smallest over the path.
    ``firm``: the most firm units the reserve rule allows the campaign (SPEC §4.1, §14).
    ``absorbed``: E_v per node of the path, so that a grant of n raises v's load K_v by
    max(0, n − E_v) (SPEC §14.2; 0 at the campaign itself): v admits n exactly when that
    rise fits its room. ``borrow``: a borrowed lease's (SPEC §14.8), the units beyond the
    firm room its siblings' idle guarantees lend and the units its borrow limit leaves.
    Holdings are settled to now."""
    if borrow is not None:
        # SPEC §14.8: free units only, within the firm room plus what is lent
        lent, left = borrow
        warm = cap = min(dim.free_now(), left, firm + lent)
    elif cls.preemptible:
        # SPEC §4.1: opportunistic grants use any free unit but the warm headroom
        warm = cap = dim.opportunistic_room()
    else:
        # SPEC §4.1, §14: the others' unmet guarantees stay free; c's own may be used
        warm = min(dim.free_now(), firm)
        cap = min(dim.reachable(), firm)
    hs = [v.hold[d] for v in path]
    left = min(v.left for v in path)
    return Limits({"ceiling": min(e + h.b - h.K                               # SPEC §4.4
                                  for h, e in zip(hs, absorbed)),
                   "capacity": cap,
                   "tokens": min(e + token_limit(h.K, h.s, h.T, dur, instant)  # SPEC §4.2
                                 for h, e in zip(hs, absorbed)),
                   "credits": credit_limit(left, dur, price, cls.free_when_broke, spend)},
                  warm=warm, price=price)


def never(path: list[Campaign], d: int, dim: Dimension, cls: ClassTerms, firm_bound: int,
          nmin: int, dur: int, price: int, instant: bool, idle: list[int],
          rise: list[int]) -> int:
    """SPEC §4.4: the rule by which an intent of at least nmin can never be met, even in
    an otherwise empty pool with full buckets and escrow refunded, else OK. Every node of
    the campaign's path (SPEC §14) is checked; ``firm_bound``: the most firm units the
    campaign could have in an empty pool (the capacity less the other campaigns'
    guarantees, in a flat set); ``idle`` and ``rise``: per node of the path, its load
    when no node holds anything (its children's guarantees) and by how much nmin would
    raise it then (nmin, in a flat set) — no state has a smaller load or rise."""
    hs = [v.hold[d] for v in path]
    if any(k + r > h.b for h, k, r in zip(hs, idle, rise)):
        return CEILING
    if cls.preemptible:
        if nmin > dim.cap - dim.headroom:
            return CAPACITY
    elif nmin > firm_bound:
        return CAPACITY
    if not instant and any(excess(k, r, h.s) * dur > h.B for h, k, r in zip(hs, idle, rise)):
        return TOKENS
    if (price and not cls.free_when_broke
            and any(not v.unlimited and lease_cost(nmin, dur, price) > v.left + v.escrow
                    for v in path)):
        return CREDITS
    return OK


def token_limit(H: int, s: int, T: int, dur: int, instant: bool) -> int:
    """SPEC §4.2: the most units a grant at holding H may add: the room below s needs no
    tokens, each unit above it needs ``dur`` unit·ns. Instant mode (experiments only)
    checks only that T is positive."""
    room = max(0, s - H)
    if instant:
        return BIG if T > 0 else room
    return room + T // dur


def credit_limit(left: int, dur: int, price: int, free_when_broke: bool,
                 max_spend: int | None) -> int:
    """SPEC §4.3: the most units whose cost the credits left (and ``max_spend``) cover.
    A class that runs free when broke is never limited by the budget; an unlimited budget
    still bounds one lease's cost by the sentinel (SPEC §2)."""
    if price == 0:
        return BIG
    lim = BIG if free_when_broke else min(left, UNLIMITED) * HOUR_NS // (dur * price)
    if max_spend is not None:
        lim = min(lim, max_spend * HOUR_NS // (dur * price))
    return lim


def congestion_multiplier(kappa_ppm: int, thresholds: tuple[int, ...],
                          multipliers: tuple[int, ...]) -> int:
    """SPEC §7: the multiplier of the first band whose threshold κ is below."""
    for thr, m in zip(thresholds, multipliers):
        if kappa_ppm < thr:
            return m
    return multipliers[len(thresholds)]
