/*
 * The admission rules of docs/spec.md §4 that are plain arithmetic on one campaign's
 * numbers, written once. The compiled engine's decision, its batch loop, its grants,
 * renewals, "never" checks, quotes and token waits all call these; the compiler inlines
 * them. Units: int64 units and ns (§2).
 */
#ifndef BURSARCORE_RULES_H
#define BURSARCORE_RULES_H

#include <stdint.h>

#include "ints.h"

/* §4.2 excess: of n units added at holding H, how many lie above the sustained rate s.
 * Only those draw on the prepaid bucket: excess · duration tokens. */
static inline int64_t bc_excess(int64_t H, int64_t n, int64_t s)
{
    return bc_max64(0, H + n - s) - bc_max64(0, H - s);
}

/* §4.2 the bucket's net rate at holding H: it fills at s - H while H is below the
 * sustained rate s (in instant mode it also drains, at H - s, above it). */
static inline int64_t bc_refill_rate(int64_t H, int64_t s)
{
    return s - H;
}

/* §4.2 the units that can be added at holding H before any lies above s: for n >= 0,
 * bc_excess(H, n, s) == max(0, n - bc_sustained_room(H, s)). */
static inline int64_t bc_sustained_room(int64_t H, int64_t s)
{
    return bc_max64(0, bc_refill_rate(H, s));
}

/* §4.4 ceiling: the units a campaign holding H may add under its burst ceiling b. */
static inline int64_t bc_ceiling_room(int64_t b, int64_t H)
{
    return b - H;
}

/* §4.1 a campaign's unmet guarantee: g less what it holds firmly. */
static inline int64_t bc_unmet(int64_t g, int64_t Hf)
{
    return bc_max64(0, g - Hf);
}

/* §4.1 the unmet-guarantee reserve: a firm lease may take capacity cap less the firm
 * holdings F and every campaign's unmet guarantee U, except its own (unmet_own), so
 * nothing granted above a guarantee squeezes another's unmet guarantee. */
static inline int64_t bc_firm_limit(int64_t cap, int64_t F, int64_t U, int64_t unmet_own)
{
    return cap - F - U + unmet_own;
}

/* §4.1 warm capacity: what a firm request can take now (free units, within the
 * reserve), and what an opportunistic one can (free units above the headroom kept for
 * firm arrivals). */
static inline int64_t bc_warm_firm(int64_t free, int64_t firm_limit)
{
    return bc_min64(free, firm_limit);
}

static inline int64_t bc_warm_opportunistic(int64_t free, int64_t headroom)
{
    return bc_max64(0, free - headroom);
}

/* §4.1, §6 what a reclaim can reach: free units, units lent to opportunistic leases, and
 * units already under preemption notice that no reclaim grant has been promised. */
static inline int64_t bc_reachable(int64_t free, int64_t oppa, int64_t rev, int64_t prom)
{
    return free + oppa + bc_max64(0, rev - prom);
}

/* §4.1 free capacity of a dimension: its capacity less the units occupied and the units
 * promised to starting leases beyond those already under preemption notice. */
static inline int64_t bc_free(int64_t cap, int64_t occ, int64_t prom, int64_t rev)
{
    return cap - occ - bc_max64(0, prom - rev);
}

/* §7 credit cost of n units for dur ns at pm micro-credits per unit-hour:
 * ceil(n * dur * pm / hour), exact for every int64 input. */
static inline bc_i128 bc_cost(int64_t n, int64_t dur, int64_t pm)
{
    bc_i128 x = (bc_i128)n * dur, a, r;
    bc_u128 p;
    uint64_t p64;
    if (x >= 0 && pm >= 0) {
        if ((x >> 63) == 0) {                       /* x * pm < 2**126 */
            p = (bc_u128)x * (bc_u128)pm;
            if ((p >> 64) == 0) {                   /* the common case: one 64-bit division */
                p64 = (uint64_t)p;
                return (bc_i128)(p64 / (uint64_t)BC_HOUR_NS + (p64 % (uint64_t)BC_HOUR_NS != 0));
            }
            return (bc_i128)((p + (bc_u128)(BC_HOUR_NS - 1)) / (bc_u128)BC_HOUR_NS);
        }
        a = x / BC_HOUR_NS;                         /* x * pm may exceed 2**127: split x */
        r = x - a * BC_HOUR_NS;
        return a * pm + (r * pm + (BC_HOUR_NS - 1)) / BC_HOUR_NS;
    }
    /* a negative factor: the same split with floor division (x = a * hour + r,
     * 0 <= r < hour), so no product beyond r * pm (< 2**105) is formed:
     * ceil(x * pm / hour) = a * pm + ceil(r * pm / hour) */
    a = bc_fdiv128(x, BC_HOUR_NS);
    r = x - a * BC_HOUR_NS;
    return a * pm - bc_fdiv128(-(r * pm), BC_HOUR_NS);
}

/* §7 what a lease priced `price` is charged: a class that runs free when the budget is
 * spent (free_when_broke) costs nothing when the budget left cannot pay it. */
static inline bc_i128 bc_charge(int free_when_broke, bc_i128 price, int64_t left)
{
    return (free_when_broke && price > left) ? 0 : price;
}

#endif /* BURSARCORE_RULES_H */
