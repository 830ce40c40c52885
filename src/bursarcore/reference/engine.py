"""Reference admission kernel: the per-decision arithmetic of SPEC §4 in plain Python.

Every function takes an :class:`~bursarcore.admission.state.EngineState` and ``now`` in
int ns, reads and writes its arrays, and returns plain ints. The compiled ``_engine``
module implements the same functions with the same signatures; the broker (policy) calls
whichever backend it was built with. Python ints never overflow, which makes this the
yardstick for the 128-bit arithmetic in the compiled kernel.
"""

from __future__ import annotations

import math

from ..admission.state import (ACTIVE, CAPACITY, CEILING, COLD, CREDITS, EXPIRED, FS_REBASE,
                               GEN_MASK, GRANTED, HOUR_NS, MAXV, OK, PPM, RECLAIM, REFUSED,
                               REVOKED, REVOKING, ROW_BITS, ROW_MASK, SLOW, STARTING, TOKENS, WARM)

# class-table columns
RANK, MULT, PRICED, PREEMPT, GRACE, FREEBROKE = range(6)
BIG = MAXV


def wrap(x: int) -> int:
    """x modulo 2**64 as a signed int64: the arithmetic of the cumulative counters
    (∫H dt, tokens minted, debited, refunded and clipped, credits debited, spent and
    refunded, and an unlimited budget's escrow). They only grow, so over a long enough run
    they leave any fixed width; like network byte counters they wrap, and every backend
    wraps them identically. No balance (T, left, H, a limited budget's escrow) is one of
    them: balances stay inside their ranges (docs/policy.md, "Ranges")."""
    return ((x + (1 << 63)) & ((1 << 64) - 1)) - (1 << 63)


# -- tokens and holdings --------------------------------------------------------------------
def excess(H: int, n: int, s: int) -> int:
    """SPEC §4.2: of n units added at holding H, how many lie above the sustained rate s.
    Only those draw on the prepaid bucket (excess · duration tokens)."""
    return max(0, H + n - s) - max(0, H - s)


def token_wait(st, c: int, d: int, n: int, dur: int) -> int:
    """SPEC §4.5: ns until c's bucket holds the tokens n more units for dur ns need
    (it refills at s − H), or -1 when it holds them now, does not refill, or could never
    hold them (the need is beyond the bucket's size B: the refill stops there, §4.2). The
    caller settled the bucket."""
    H, s = int(st.H[c, d]), int(st.s[c, d])
    total = excess(H, n, s) * dur
    need = total - int(st.T[c, d])
    if st.scal[1] or s - H <= 0 or need <= 0 or total > int(st.Bcap[c, d]):
        return -1
    return -(-need // (s - H))


def settle(st, c: int, d: int, t: int) -> None:
    """Bring campaign c's bucket on dimension d to time t (SPEC §4.2).

    Prepaid mode: T grows at (s − H)+ per second, capped at B. Instant mode (experiments
    only): T moves at (s − H), so it also drains while H > s, floored at 0. Also
    accumulates ∫H dt (unit·ns) for fair share.
    """
    dt = t - int(st.tlast[c, d])
    if dt <= 0:
        return
    st.tlast[c, d] = t
    H = int(st.H[c, d])
    st.acc[c, d] = wrap(int(st.acc[c, d]) + H * dt)
    rate = int(st.s[c, d]) - H
    T = int(st.T[c, d])
    if rate > 0:
        add = min(rate * dt, int(st.Bcap[c, d]) - T)
        st.T[c, d] = T + add
        st.tok_minted[c, d] = wrap(int(st.tok_minted[c, d]) + add)
    elif rate < 0 and st.scal[1]:
        drain = min(-rate * dt, T)
        st.T[c, d] = T - drain
        st.tok_debited[c, d] = wrap(int(st.tok_debited[c, d]) + drain)


def unmet(st, c: int, d: int) -> int:
    return max(0, int(st.g[c, d]) - int(st.Hf[c, d]))


def free_now(st, d: int) -> int:
    """Units a warm grant may take now, counting units promised to starting leases."""
    return int(st.cap[d]) - int(st.occ[d]) - max(0, int(st.prom[d]) - int(st.rev[d]))


def fs_weight(st, t: int) -> float:
    """w = 2^((t − E)/half-life) for the fair-share fold (SPEC §6), moving the epoch E to t
    first when t is more than FS_REBASE half-lives ahead of it (every campaign row's fs_S
    and fs_G scaled by the same power of two, so usages do not change; the broker's time
    only moves forward, so E never needs to move back)."""
    hl, E = int(st.fs_par[0]), int(st.fs_par[1])
    x = float(t - E) / float(hl)
    if x > FS_REBASE:
        f = math.pow(2.0, -x)
        for c in range(st.fs_S.shape[0]):
            st.fs_S[c] = float(st.fs_S[c]) * f
            st.fs_G[c] = float(st.fs_G[c]) * f
        st.fs_par[1] = t
        x = 0.0
    return math.pow(2.0, x)


def _hold(st, c: int, d: int, delta: int, firm: bool) -> None:
    """Change c's holding by delta (caller settled first: tlast is now), keeping F and U
    exact; on the primary dimension, fold the holding so far into c's fair-share usage."""
    if d == 0:
        w = fs_weight(st, int(st.tlast[c, 0]))
        st.fs_S[c] = float(st.fs_S[c]) + float(int(st.H[c, 0])) * (w - float(st.fs_G[c]))
        st.fs_G[c] = w
    st.H[c, d] += delta
    if firm:
        before = unmet(st, c, d)
        st.Hf[c, d] += delta
        st.F[d] += delta
        st.U[d] += unmet(st, c, d) - before


# -- congestion and price --------------------------------------------------------------------
def ring_advance(st, t: int) -> None:
    """Move the congestion window's ring to the bin holding t, clearing bins that left it."""
    b = t // st.bin_ns
    cur = int(st.scal[0])
    if b <= cur:
        return
    steps = min(b - cur, st.bins)
    for d in range(st.D):
        for j in range(1, steps + 1):
            k = (cur + j) % st.bins
            st.ring_sum[d] -= st.ring[d, k]
            st.ring[d, k] = 0
    st.scal[0] = b


def congestion_ppm(st, d: int) -> int:
    """κ in ppm: (shortfall in the window + pending priced demand) / free units."""
    return (int(st.ring_sum[d]) + int(st.pend[d])) * PPM // max(1, free_now(st, d))


def congestion_mult(st, d: int) -> int:
    k = congestion_ppm(st, d)
    for i in range(st.cong_thr.shape[0]):
        if k < st.cong_thr[i]:
            return int(st.cong_mult[i])
    return int(st.cong_mult[st.cong_thr.shape[0]])


def price_pm(st, d: int, k: int) -> int:
    """Micro-credits per unit-hour for class k on dimension d, at this instant."""
    m = int(st.cls[k, MULT])
    if st.cls[k, PRICED]:
        m = m * congestion_mult(st, d) // PPM
    return int(st.price[d]) * m // PPM


def cost(n: int, dur: int, pm: int) -> int:
    """Credits (micro) for n units for dur ns at pm: ceil(n·dur·pm / hour)."""
    return -(-(n * dur * pm) // HOUR_NS)


def charge(st, c: int, k: int, price: int) -> int:
    """What a lease priced ``price`` is charged (SPEC §7): a class that runs free when the
    budget is spent costs nothing when the budget cannot pay it."""
    if st.cls[k, FREEBROKE] and price > int(st.left[c]):
        return 0
    return price


def _count_shortfall(st, d: int, units: int) -> None:
    k = int(st.scal[0]) % st.bins
    st.ring[d, k] += units
    st.ring_sum[d] += units


# -- the decision ---------------------------------------------------------------------------
def decide(st, c: int, d: int, k: int, nmin: int, nmax: int, dur: int, max_spend: int,
           t: int) -> tuple[int, int, int, int, tuple[int, int, int, int]]:
    """Size an intent (SPEC §4.4): the largest n ≤ nmax that satisfies capacity and
    isolation (§4.1), tokens (§4.2), credits and max_spend (§4.3) and the ceiling.

    Returns ``(n, reason, path, pm, limits)``: reason is the binding rule when n < nmin,
    path WARM when n fits in free units now, else RECLAIM; limits are
    (ceiling, capacity, tokens, credits). Settles c's bucket; changes nothing else.
    """
    lim_ceil, lim_cap, lim_tok, lim_cred, lim_warm, pm = limits(st, c, d, k, dur, max_spend, t)
    n = max(0, min(nmax, lim_ceil, lim_cap, lim_tok, lim_cred))
    reason = OK
    if n < nmin:
        for code, lim in ((CEILING, lim_ceil), (CAPACITY, lim_cap), (TOKENS, lim_tok),
                          (CREDITS, lim_cred)):
            if lim <= n:
                reason = code
                break
    path = WARM if n <= lim_warm else RECLAIM
    return n, reason, path, pm, (lim_ceil, lim_cap, lim_tok, lim_cred)


def limits(st, c: int, d: int, k: int, dur: int, max_spend: int,
           t: int) -> tuple[int, int, int, int, int, int]:
    """The most units each rule allows one more lease of campaign c for dur ns at t
    (SPEC §4.1–§4.4): ``(ceiling, capacity, tokens, credits, warm, pm)``, where capacity
    counts units a reclaim could free and warm only those free now, and pm is the price.
    Settles c's bucket; changes nothing else."""
    settle(st, c, d, t)
    firm = not st.cls[k, PREEMPT]
    H = int(st.H[c, d])
    s = int(st.s[c, d])
    lim_ceil = int(st.b[c, d]) - H
    T = int(st.T[c, d])
    room = max(0, s - H)             # units within the sustained rate: no excess (§4.2)
    if st.scal[1]:
        lim_tok = BIG if T > 0 else room
    else:
        lim_tok = room + T // dur
    pm = price_pm(st, d, k)
    if pm == 0:
        lim_cred = BIG
    else:
        left = int(st.left[c])
        # an unlimited budget (left = MAXV, never drawn down) still bounds one lease's cost
        # by MAXV, so the cost and the escrow stay inside int64
        lim_cred = BIG if st.cls[k, FREEBROKE] else min(left, MAXV) * HOUR_NS // (dur * pm)
        if max_spend >= 0:
            lim_cred = min(lim_cred, max_spend * HOUR_NS // (dur * pm))
    free = free_now(st, d)
    opportunistic, reachable, firm_room = dim_figures(st, d)
    if firm:
        # §4.1 the reserve: the others' unmet guarantees stay free; c's own may be used
        lim_firm = firm_room + unmet(st, c, d)
        lim_warm = min(free, lim_firm)
        lim_cap = min(reachable, lim_firm)
    else:
        lim_warm = lim_cap = opportunistic
    return lim_ceil, lim_cap, lim_tok, lim_cred, lim_warm, pm


def dim_figures(st, d: int) -> tuple[int, int, int]:
    """Dimension d's capacity levels (SPEC §4.1): the free units above the warm headroom
    (what an opportunistic lease may take), the units a reclaim can reach (free, lent to
    opportunistic leases, and under preemption notice but not yet promised to a reclaim
    grant), and the firm room (capacity less firm holdings and unmet guarantees)."""
    free = free_now(st, d)
    return (max(0, free - int(st.headroom[d])),
            free + int(st.oppa[d]) + max(0, int(st.rev[d]) - int(st.prom[d])),
            int(st.cap[d]) - int(st.F[d]) - int(st.U[d]))


def quote(st, c: int, d: int, k: int, sizes, durs, t: int):
    """SPEC §4.4 and §7 for every (size, duration): each cell is what an intent for
    exactly that many units for that long would meet now, changing nothing but c's
    settled bucket. Returns ``(cost, path, reason)`` as nested lists (len(sizes) rows of
    len(durs)): the cost in micro-credits (a float), the path (WARM: free now; RECLAIM:
    after reclaiming lent units; COLD: neither), and the first rule the full size breaks
    in the order ceiling, capacity, tokens, credits (OK if none)."""
    sizes, durs = [int(n) for n in sizes], [int(x) for x in durs]
    cells = {}
    for b, dur in enumerate(durs):       # the limits depend on the duration, not the size
        lim_ceil, lim_cap, lim_tok, lim_cred, lim_warm, pm = limits(st, c, d, k, dur, -1, t)
        for a, n in enumerate(sizes):
            cells[a, b] = (float(charge(st, c, k, cost(n, dur, pm))),
                           WARM if n <= lim_warm else RECLAIM if n <= lim_cap else COLD,
                           CEILING if lim_ceil < n else CAPACITY if lim_cap < n
                           else TOKENS if lim_tok < n else CREDITS if lim_cred < n else OK)
    return tuple([[cells[a, b][f] for b in range(len(durs))] for a in range(len(sizes))]
                 for f in range(3))


def decide_keys(st, keys, t: int, out_reason) -> int:
    """The pending pass's "can anything be granted" probe (SPEC §4.5): row j of ``keys``
    ((K, 6) ints: campaign, dim, class, nmin, duration, max_spend) is decided at
    nmin = nmax = its nmin, in order. Returns the first row that could be granted, or -1
    with each row's reason written to ``out_reason[j]``. Settles each row's bucket, as
    ``decide`` does; changes nothing else."""
    for j in range(len(keys)):
        c, d, k, m, dur, spend = (int(v) for v in keys[j])
        n, reason, _, _, _ = decide(st, c, d, k, m, m, dur, spend, t)
        if n >= m:
            return j
        out_reason[j] = reason
    return -1


def never(st, c: int, d: int, k: int, nmin: int, dur: int, pm: int) -> int:
    """The reason an intent can *never* be met, or OK (SPEC §4.4: refused at once)."""
    if nmin > int(st.b[c, d]):
        return CEILING
    if st.cls[k, PREEMPT]:
        if nmin > int(st.cap[d]) - int(st.headroom[d]):
            return CAPACITY
    else:
        others_g = int(st.g[: st.C, d].sum()) - int(st.g[c, d])
        if nmin > int(st.cap[d]) - others_g:
            return CAPACITY
    if not st.scal[1] and excess(0, nmin, int(st.s[c, d])) * dur > int(st.Bcap[c, d]):
        return TOKENS
    left = int(st.left[c])
    if (pm and left < MAXV and not st.cls[k, FREEBROKE]
            and cost(nmin, dur, pm) > left + int(st.escrow[c])):
        return CREDITS
    return OK


def grant(st, c: int, d: int, k: int, n: int, dur: int, pm: int, t: int, starting: bool,
          intent: int) -> int:
    """Commit a grant of n units: escrow tokens and credits, hold units, record the lease.

    A ``starting`` lease (reclaim path) holds its units in reserve (``prom``) until
    :func:`activate`; otherwise slots are placed now and the expiry is scheduled.
    The caller has made room (``EngineState.grow_leases``); if it has not, IndexError is
    raised before anything changes.
    """
    _room(st, d, n, 1, not starting)
    settle(st, c, d, t)
    firm = not st.cls[k, PREEMPT]
    H = int(st.H[c, d])
    s = int(st.s[c, d])
    ex = 0 if st.scal[1] else excess(H, n, s)
    st.T[c, d] -= ex * dur
    st.tok_debited[c, d] = wrap(int(st.tok_debited[c, d]) + ex * dur)
    price = charge(st, c, k, cost(n, dur, pm))
    if int(st.left[c]) < MAXV:
        st.left[c] -= price
    st.escrow[c] = wrap(int(st.escrow[c]) + price)
    st.cred_debited[c] = wrap(int(st.cred_debited[c]) + price)
    _hold(st, c, d, n, firm)
    lid = _new_row(st)
    r = lid & ROW_MASK
    st.camp[r], st.dim[r], st.units[r], st.firm[r] = c, d, n, int(firm)
    st.state[r] = STARTING if starting else ACTIVE
    st.lcls[r] = k
    st.t_grant[r] = t
    st.dur[r] = dur
    st.excess[r] = ex
    st.cost[r] = price
    st.intent[r] = intent
    st.revoke_at[r] = 0
    if starting:
        st.prom[d] += n
        st.t_start[r] = 0
        st.t_end[r] = 0
        st.slot_off[r] = -1
    else:
        _place(st, lid, d, n, t)
    return lid


# -- lease rows and ids (see admission.state.ROW_BITS) --------------------------------------
def _reusable(st) -> bool:
    """Whether the next grant takes an ended row: more than ``reuse_after`` wait."""
    q = int(st.lfree[2])
    return q >= 0 and int(st.lfree[1]) - int(st.lfree[0]) > q


def _new_row(st) -> int:
    """The id of a new lease: the oldest reusable ended row (its generation moved on), or
    the next unused row."""
    if _reusable(st):
        head = int(st.lfree[0])
        r = int(st.freeq[head % st.freeq.shape[0]])
        st.lfree[0] = head + 1
        g = (int(st.gen[r]) + 1) & GEN_MASK
        st.gen[r] = g
        return r | (g << ROW_BITS)
    r = int(st.scal[2])            # an unused row: generation 0 (rows past the high-water
    st.scal[2] = r + 1             # mark are zero), so its id is the row
    return r


def _free_row(st, r: int) -> None:
    """Queue an ended lease's row for reuse."""
    if int(st.lfree[2]) >= 0:
        tail = int(st.lfree[1])
        st.freeq[tail % st.freeq.shape[0]] = r
        st.lfree[1] = tail + 1


def row(st, lid: int) -> int:
    """The row of live-or-ended lease ``lid``; IndexError if out of range or stale (its row
    holds a later lease)."""
    r = lid & ROW_MASK
    if lid < 0 or r >= st.camp.shape[0] or int(st.gen[r]) != lid >> ROW_BITS:
        raise IndexError(f"lease {lid} out of range or stale")
    return r


def _room(st, d: int, n: int, leases: int, place: bool) -> None:
    """Refuse (IndexError, nothing changed) a grant or activation the arrays cannot hold."""
    if int(st.scal[2]) + leases > st.camp.shape[0] and not (leases == 1 and _reusable(st)):
        raise IndexError("lease store full: call EngineState.grow_leases first")
    if place:
        if int(st.arena_top[0]) + n > st.arena.shape[0]:
            raise IndexError("slot arena full: call EngineState.grow_leases first")
        if n > int(st.top[d]):
            raise IndexError(f"only {int(st.top[d])} free slots on dimension {d}, need {n}")


def _place(st, lid: int, d: int, n: int, t: int) -> None:
    """Activate: pop n free slots into the lease's arena range and schedule its expiry."""
    r = lid & ROW_MASK
    off = int(st.arena_top[0])
    top = int(st.top[d])
    for j in range(n):
        st.arena[off + j] = st.free_slots[d, top - 1 - j]
    st.top[d] = top - n
    st.arena_top[0] = off + n
    st.slot_off[r] = off
    st.occ[d] += n
    if not st.firm[r]:
        st.oppa[d] += n
    st.state[r] = ACTIVE
    st.t_start[r] = t
    st.t_end[r] = t + int(st.dur[r])
    heap_push(st, t + int(st.dur[r]), lid)


def activate(st, lid: int, t: int) -> None:
    """A starting lease's reclaim grace is over: its promised units become held slots."""
    r = row(st, lid)
    d, n = int(st.dim[r]), int(st.units[r])
    _room(st, d, n, 0, True)
    st.prom[d] -= n
    _place(st, lid, d, n, t)


def preempt(st, lid: int, t: int, grace: int) -> int:
    """Mark an active opportunistic lease revoking; returns its revocation deadline."""
    r = row(st, lid)
    d, n = int(st.dim[r]), int(st.units[r])
    st.state[r] = REVOKING
    st.revoke_at[r] = t + grace
    st.rev[d] += n
    st.oppa[d] -= n
    return t + grace


def end_lease(st, lid: int, t: int, new_state: int) -> None:
    """End a lease at t (release, expiry, revocation): free its units and slots, refund
    the unused remainder of its prepaid tokens and its credits pro rata (SPEC §4.2, §4.3)."""
    r = row(st, lid)
    c, d, n = int(st.camp[r]), int(st.dim[r]), int(st.units[r])
    state = int(st.state[r])
    firm = bool(st.firm[r])
    if state not in (STARTING, ACTIVE, REVOKING):
        raise IndexError(f"lease {lid} has already ended")
    if state != STARTING and int(st.top[d]) + n > st.free_slots.shape[1]:
        raise IndexError(f"lease {lid} would overfill dimension {d}'s free-slot stack")
    settle(st, c, d, t)
    dur = int(st.dur[r])
    if state == STARTING:
        remaining = dur
        st.prom[d] -= n
    else:
        remaining = max(0, int(st.t_end[r]) - t)
        st.occ[d] -= n
        if state == REVOKING:
            st.rev[d] -= n
        elif not firm:
            st.oppa[d] -= n
        off, top = int(st.slot_off[r]), int(st.top[d])
        for j in range(n):
            st.free_slots[d, top + j] = st.arena[off + n - 1 - j]
        st.top[d] = top + n
    refund = int(st.excess[r]) * remaining
    room = int(st.Bcap[c, d]) - int(st.T[c, d])
    st.T[c, d] += min(refund, room)
    st.tok_refunded[c, d] = wrap(int(st.tok_refunded[c, d]) + min(refund, room))
    st.tok_clipped[c, d] = wrap(int(st.tok_clipped[c, d]) + max(0, refund - room))
    price = int(st.cost[r])
    back = price * remaining // dur
    if int(st.left[c]) < MAXV:
        st.left[c] += back
    st.escrow[c] = wrap(int(st.escrow[c]) - price)
    st.refunded[c] = wrap(int(st.refunded[c]) + back)
    st.spent[c] = wrap(int(st.spent[c]) + price - back)
    _hold(st, c, d, -n, firm)
    if state == STARTING and new_state == REVOKED:
        st.revoke_at[r] = t         # revoked before it started: revoked now (SPEC §4.6)
    st.state[r] = new_state
    _free_row(st, r)


def renew(st, lid: int, ext: int, t: int, max_spend: int) -> tuple[int, int]:
    """Extend an active lease by ext ns, re-running §4.2 and §4.3 for it atomically.

    The prepaid segment is re-priced from t: the unused escrow is credited back and the
    lease's marginal excess (as the top-most holding) is debited for t..new end.
    Returns ``(reason, cost)``; reason OK means renewed.
    """
    r = row(st, lid)
    c, d, n, k = int(st.camp[r]), int(st.dim[r]), int(st.units[r]), int(st.lcls[r])
    settle(st, c, d, t)
    end = int(st.t_end[r])
    H, s = int(st.H[c, d]), int(st.s[c, d])
    new_end = end + ext
    if st.scal[1]:
        ex_new, delta = 0, 0
    else:
        ex_new = excess(H - n, n, s)       # the lease's n units as the top-most held
        delta = ex_new * (new_end - t) - int(st.excess[r]) * (end - t)
        if delta > int(st.T[c, d]):
            return TOKENS, 0
    pm = price_pm(st, d, k)
    price = cost(n, ext, pm)
    left = int(st.left[c])
    price = charge(st, c, k, price)
    if price > min(left, MAXV):        # (an unlimited budget bounds a cost by MAXV)
        return CREDITS, price
    if 0 <= max_spend < price:
        return CREDITS, price
    if delta >= 0:
        st.T[c, d] -= delta
        st.tok_debited[c, d] = wrap(int(st.tok_debited[c, d]) + delta)
    else:
        room = int(st.Bcap[c, d]) - int(st.T[c, d])
        st.T[c, d] += min(-delta, room)
        st.tok_refunded[c, d] = wrap(int(st.tok_refunded[c, d]) + min(-delta, room))
        st.tok_clipped[c, d] = wrap(int(st.tok_clipped[c, d]) + max(0, -delta - room))
    st.excess[r] = ex_new
    if left < MAXV:
        st.left[c] -= price
    st.escrow[c] = wrap(int(st.escrow[c]) + price)
    st.cred_debited[c] = wrap(int(st.cred_debited[c]) + price)
    st.cost[r] = wrap(int(st.cost[r]) + price)
    st.dur[r] += ext
    st.t_end[r] = new_end
    heap_push(st, new_end, lid)
    return OK, price


# -- expiry heap (array-based binary heap ordered by (time, lease id)) -------------------
def _less(st, i: int, j: int) -> bool:
    a, b = int(st.heap_t[i]), int(st.heap_t[j])
    return a < b or (a == b and int(st.heap_id[i]) < int(st.heap_id[j]))


def heap_push(st, t: int, lid: int) -> None:
    i = int(st.scal[3])
    if i >= st.heap_t.shape[0]:
        st.grow_heap()
    st.heap_t[i], st.heap_id[i] = t, lid
    st.scal[3] = i + 1
    while i > 0:
        p = (i - 1) // 2
        if not _less(st, i, p):
            break
        st.heap_t[i], st.heap_t[p] = st.heap_t[p], st.heap_t[i]
        st.heap_id[i], st.heap_id[p] = st.heap_id[p], st.heap_id[i]
        i = p


def heap_pop(st) -> None:
    if st.scal[3] <= 0:
        raise IndexError("heap_pop from an empty expiry heap")
    n = int(st.scal[3]) - 1
    st.heap_t[0], st.heap_id[0] = st.heap_t[n], st.heap_id[n]
    st.scal[3] = n
    i = 0
    while True:
        lo, r, m = 2 * i + 1, 2 * i + 2, i
        if lo < n and _less(st, lo, m):
            m = lo
        if r < n and _less(st, r, m):
            m = r
        if m == i:
            break
        st.heap_t[i], st.heap_t[m] = st.heap_t[m], st.heap_t[i]
        st.heap_id[i], st.heap_id[m] = st.heap_id[m], st.heap_id[i]
        i = m


def _live(st, te: int, lid: int) -> bool:
    """Whether the heap entry (te, lid) is its lease's scheduled end: the lease is current
    (its row not reused), active or revoking, and ends at te."""
    r = lid & ROW_MASK
    return (0 <= lid and r < st.camp.shape[0] and int(st.gen[r]) == lid >> ROW_BITS
            and int(st.state[r]) in (ACTIVE, REVOKING) and int(st.t_end[r]) == te)


def next_expiry(st) -> int:
    """Time of the earliest scheduled expiry, or -1 (SPEC §4.4: a capacity refusal's
    retry_after). Stale entries at the top of the heap (a renewal or an end moved or
    removed the lease's end) are dropped first."""
    while st.scal[3] > 0:
        if _live(st, int(st.heap_t[0]), int(st.heap_id[0])):
            return int(st.heap_t[0])
        heap_pop(st)
    return -1


def advance(st, t: int, out) -> int:
    """Expire active or revoking leases whose end is ≤ t, in (end, id) order, each settled
    at its own end time, until ``out`` is full. Writes their ids to ``out`` and returns how
    many; the caller calls again while it gets a full buffer. Stale heap entries (ended or
    renewed leases, and leases whose row was reused: an entry holds the full id) are
    skipped."""
    m = 0
    while st.scal[3] > 0 and st.heap_t[0] <= t and m < len(out):
        te, lid = int(st.heap_t[0]), int(st.heap_id[0])
        heap_pop(st)
        r = lid & ROW_MASK
        if lid < 0 or r >= st.camp.shape[0]:
            raise IndexError(f"lease {lid} in the expiry heap is out of range")
        if _live(st, te, lid):
            end_lease(st, lid, te, EXPIRED)
            out[m] = lid
            m += 1
    return m


# -- the fast path ---------------------------------------------------------------------------
def admit(st, c: int, d: int, k: int, nmin: int, nmax: int, dur: int, max_spend: int, t: int,
          intent: int, out) -> int:
    """One decision on the fast path. ``out`` (int64[4]) receives
    (n, reason, lease id, cost). Returns GRANTED (warm, committed), REFUSED (never
    satisfiable, nothing changed but the bucket settle) or SLOW (needs the policy layer:
    pending queue or reclaim; nothing committed)."""
    n, reason, path, pm, lims = decide(st, c, d, k, nmin, nmax, dur, max_spend, t)
    out[0], out[1], out[2], out[3] = n, reason, -1, 0
    if n >= nmin and path == WARM:
        priced = bool(st.cls[k, PRICED])
        if priced and lims[1] < nmax and n < nmax:
            _count_shortfall(st, d, nmax - n)
        lid = grant(st, c, d, k, n, dur, pm, t, False, intent)
        out[2], out[3] = lid, int(st.cost[lid & ROW_MASK])
        return GRANTED
    if n < nmin:
        why = never(st, c, d, k, nmin, dur, pm)
        if why != OK:
            out[1] = why
            if st.cls[k, PRICED] and why == CAPACITY:
                _count_shortfall(st, d, nmax)
            return REFUSED
    return SLOW


REC_WIDTH = 11
"""Columns of ``admit_batch``'s optional ``rec`` output, one row per decided item: the
rule inputs before the decision (tokens, credits, free units, unmet guarantees, and the
ceiling, capacity, tokens and credits limits — exact, capped at MAXV) and the state after
(tokens, credits, holding) — what a journal record of the item holds."""


def admit_batch(st, camps, ks, dims, nmins, nmaxs, durs, t: int, intent0: int,
                out_n, out_reason, out_lease, start: int, rec=None) -> int:
    """Decide items start.. in order with :func:`admit`; stop at the first SLOW item and
    return its index (or len). Item j's intent id is intent0 + j. With ``rec`` (int64
    (len, REC_WIDTH)), each decided item's journal inputs and state after are written."""
    buf = [0, 0, 0, 0]
    m = len(camps)
    j = start
    while j < m:
        c, d, k = int(camps[j]), int(dims[j]), int(ks[j])
        nmin, nmax, dur = int(nmins[j]), int(nmaxs[j]), int(durs[j])
        if rec is not None:
            _, _, _, _, lims = decide(st, c, d, k, nmin, nmax, dur, -1, t)
            before = (int(st.T[c, d]), int(st.left[c]), free_now(st, d), int(st.U[d]),
                      *(min(x, MAXV) for x in lims))
        r = admit(st, c, d, k, nmin, nmax, dur, -1, t, intent0 + j, buf)
        if r == SLOW:
            return j
        out_n[j], out_reason[j], out_lease[j] = buf[0], buf[1], buf[2]
        if rec is not None:
            for i, v in enumerate(before + (int(st.T[c, d]), int(st.left[c]), int(st.H[c, d]))):
                rec[j, i] = v
        j += 1
    return m
