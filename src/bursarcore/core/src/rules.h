/*
 * The admission rules of docs/spec.md §4 that are plain arithmetic on one campaign's
 * numbers, written once, and the rules with a limit together (bc_size, bc_never,
 * bc_first_broken): what each allows, in the order a refusal names them. The compiled
 * engine's decision, its batch loop, its grants, renewals, "never" checks, quotes and token
 * waits all call these; the compiler inlines them. Units: int64 units and ns (§2).
 */
#ifndef BURSARCORE_RULES_H
#define BURSARCORE_RULES_H

#include <stdint.h>

#include "bursarcore.h"
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

/* §14.3 a node's slack: the part of its guarantee g that neither its own firm holding Hf
 * nor its children's commitments Rch (Σ R_ch) use. A node without children: its unmet
 * guarantee (bc_unmet). */
static inline int64_t bc_slack(int64_t g, int64_t Hf, int64_t Rch)
{
    return bc_unmet(g, Hf + Rch);
}

/* §14.3 a node's commitment R = max(g, Hf + Rch): its guarantee, or what its own firm
 * holding and its children's commitments take beyond it. */
static inline int64_t bc_commitment(int64_t g, int64_t Hf, int64_t Rch)
{
    return bc_max64(g, Hf + Rch);
}

/* §14.2 what a child whose guarantee is g and whose load is K adds to its parent's load
 * (what the parent's ceiling and bucket bind): its guarantee, reserved, or its load beyond
 * it. */
static inline int64_t bc_child_measure(int64_t g, int64_t K)
{
    return bc_max64(g, K);
}

/* §14.2 a level absorbing a rise: the change x of a child's load K (g its guarantee) moves
 * its parent's load by this much. For a rise (x >= 0) it is max(0, x − bc_unmet(g, K)): the
 * child absorbs what it can in the part of its guarantee its load leaves unused, and passes
 * the rest on (so a rise of n at a node is max(0, n − E_v) at an ancestor v, E_v the sum of
 * bc_unmet over the path below v); a fall (x < 0) the same way back. Every walk that moves
 * or prices a load up a path takes its steps here. */
static inline int64_t bc_rise_through(int64_t g, int64_t K, int64_t x)
{
    return bc_child_measure(g, K + x) - bc_child_measure(g, K);
}

/* §4.1 the unmet-guarantee reserve: a firm lease may take capacity cap less the firm
 * holdings F and every campaign's unmet guarantee U, except its own (unmet_own), so
 * nothing granted above a guarantee squeezes another's unmet guarantee. In a tree (§14.3)
 * U is Σ_top R − F and unmet_own the slack of the node's path: cap − Σ_top R + Σ slack. */
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
 * the units that come to the pool beyond every promise (rev: the units under preemption
 * notice plus bc_free's reserve, so that rev − prom is what they leave free). */
static inline int64_t bc_reachable(int64_t free, int64_t oppa, int64_t rev, int64_t prom)
{
    return free + oppa + bc_max64(0, rev - prom);
}

/* §4.1, §4.6 free capacity of a dimension: its capacity less the units occupied (placed)
 * and the reserve for the reclaim grants promised: the most, over their activation times τ,
 * that the grants starting by τ need beyond the units under notice arriving by τ (resv, the
 * policy layer's: it knows the activation times), and never less than what they need in
 * all beyond all the units under notice (prom − rev). */
static inline int64_t bc_reserve(int64_t prom, int64_t rev, int64_t resv)
{
    return bc_max64(resv, prom - rev);
}

static inline int64_t bc_free(int64_t cap, int64_t occ, int64_t prom, int64_t rev,
                              int64_t resv)
{
    return cap - occ - bc_reserve(prom, rev, resv);
}

/* §7 credit cost of n units for dur ns at pm micro-credits per unit-hour:
 * ceil(n * dur * pm / hour), exact while n * dur * pm fits 128 bits (bc_cost_exact; always
 * within the inputs' bounds, §2). */
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

/* Whether bc_cost(n, dur, pm) is exact: n * dur * pm fits 128 bits (so does every product it
 * forms), as it always does when n * dur fits int64. */
static inline int bc_cost_exact(int64_t n, int64_t dur, int64_t pm)
{
    int64_t x64;
    bc_i128 p;
    if (!__builtin_mul_overflow(n, dur, &x64))
        return 1;
    return !__builtin_mul_overflow((bc_i128)n * dur, (bc_i128)pm, &p);
}

/* §7 what a lease priced `price` is charged: a class that runs free when the budget is
 * spent (free_when_broke) costs nothing when the budget left cannot pay it. */
static inline bc_i128 bc_charge(int free_when_broke, bc_i128 price, int64_t left)
{
    return (free_when_broke && price > left) ? 0 : price;
}

/* §4.2 the most units a grant at holding H may add for dur > 0 ns: the room below s needs
 * no tokens, each unit above it dur unit·ns of the T held. */
static inline int64_t bc_token_limit(int64_t H, int64_t s, int64_t T, int64_t dur)
{
    return bc_sustained_room(H, s) + bc_fdiv64(T, dur);
}

/* §4.2 instant enforcement (experiments): only a positive balance is checked, so a grant
 * at holding H may add any number of units while T > 0, else those below s. */
static inline int64_t bc_token_limit_instant(int64_t H, int64_t s, int64_t T)
{
    return T > 0 ? BC_MAXV : bc_sustained_room(H, s);
}

/* -- the rules with a limit, together (§4.4) ------------------------------------------------ */

/* The rule with limit i (BC_LIMIT_*) is decided as this reason. */
static const int64_t bc_limit_reason[BC_LIMITS] = {
    BC_REASON_CEILING, BC_REASON_CAPACITY, BC_REASON_TOKENS, BC_REASON_CREDITS
};

/* What the rules read for one request: the campaign's numbers on the dimension (holding H,
 * sustained rate s, ceiling b, tokens T, bucket size Bcap, guarantee g (for a node of a
 * tree, §14.3: Σ over its path of g_v less its children's), its unmet guarantee (in a tree,
 * the slack of its path)), its credits (left and in escrow, micro-credits), the dimension's
 * levels (capacity, firm holdings F, unmet guarantees U, their sum of guarantees, free units,
 * units lent to opportunistic leases, under notice plus the reserve (bc_reachable),
 * promised, the opportunistic headroom), the price (micro-credits per unit-hour), the
 * duration and spending cap (< 0: none), the class's terms, and the cost of a size when the
 * caller knows it. The engine fills it (k_request). */
typedef struct {
    int64_t H, s, b, T, Bcap, g, unmet;
    int64_t left, escrow;
    int64_t cap, F, U, gsum, free, oppa, rev, prom, headroom;
    int64_t pm, dur, max_spend;
    int firm, free_when_broke, instant;   /* firm: 1 firm, 0 opportunistic, 2 borrowed (§14.8) */
    int64_t cn, ccost;  /* the cost of cn units when the caller knows it: bc_cost(cn, dur, pm),
                           exact (bc_cost_exact) and within int64; cn < 0: none known */
} bc_req;

/* A decision and the limits that made it: lim[i] the most units rule i allows one more
 * lease (BC_LIMIT_*, BC_MAXV when it does not bind; with another level's limits, bc_size's
 * xlim, the smaller of the two), warm the units the capacity rule allows from those free
 * now. Which level's limit each is, the engine finds when asked (k_levels_of, §14.2). */
typedef struct {
    int64_t n, reason, path, pm;
    int64_t lim[BC_LIMITS];
    int64_t warm;
} bc_dec;

enum { BC_LAZY = 1 };   /* bc_limit: the limit is only compared with a size (bc_allows) */

/* The loops over the rules with a limit are unrolled, so each rule's case is chosen at
 * compile time and its figures stay in registers. */
#if defined(__GNUC__)
#define BC_UNROLL _Pragma("GCC unroll 8")
#else
#define BC_UNROLL
#endif

/* §4.3 the credit rule's terms for one request: a lease of m units is allowed when its cost
 * bc_cost(m, dur, pm) is at most L, the budget left or the spending cap, whichever is less,
 * so the limit is L·hour // den units (den the duration times the price), clamped to BC_MAXV
 * when `capped` (a cap alone binds); `on` is 0 when the rule does not bind. */
typedef struct {
    int64_t L;
    int capped, on;
} bc_credit;

/* Fill *ct for q: 0 or an error code. */
static inline int bc_credit_terms(const bc_req *q, bc_credit *ct)
{
    ct->on = 0;
    ct->capped = 0;
    ct->L = 0;
    if (q->pm == 0)
        return 0;
    if (q->dur == 0 && (!q->free_when_broke || q->max_spend >= 0))
        return BC_E_ZERODIV;       /* (den == 0: pm != 0 here) */
    if (!q->free_when_broke) {     /* (an unlimited budget, left = MAXV, bounds a cost too) */
        ct->L = q->left;
        ct->on = 1;
    }
    if (q->max_spend >= 0) {
        /* min(X1 // den, X2 // den) == min(X1, X2) // den; min(BIG, X2 // den) otherwise */
        ct->capped = !ct->on;
        if (ct->capped || q->max_spend < ct->L)
            ct->L = q->max_spend;
        ct->on = 1;
    }
    return 0;
}

static inline int64_t bc_credit_limit(const bc_req *q, const bc_credit *ct)
{
    bc_i128 x = bc_fdiv128((bc_i128)ct->L * BC_HOUR_NS, (bc_i128)q->dur * q->pm);
    if (ct->capped && x > BC_MAXV)
        x = BC_MAXV;
    return x > BC_MAXV ? BC_MAXV : x < -BC_MAXV ? -BC_MAXV : (int64_t)x;
}

/* Rule i's exact limit for q (its terms valid: bc_limit returned 0 or BC_LAZY for it; ct the
 * credit rule's terms). */
static inline int64_t bc_limit_exact(const bc_req *q, const bc_credit *ct, int i)
{
    switch (i) {
    case BC_LIMIT_TOKENS:
        return bc_token_limit(q->H, q->s, q->T, q->dur);
    case BC_LIMIT_CREDITS:
        return ct->on ? bc_credit_limit(q, ct) : BC_MAXV;
    }
    return BC_MAXV;
}

/* Rule i's limit for q to *lim (§4.1–§4.4; the capacity rule also sets *warm), or, when
 * `exact` is 0 and the limit takes a division, BC_LAZY: it is then only compared with the
 * size the other rules allow (bc_allows). 0, BC_LAZY or an error code. */
static inline int bc_limit(const bc_req *q, const bc_credit *ct, int i, int exact, int64_t *lim,
                           int64_t *warm)
{
    int64_t firm;
    switch (i) {
    case BC_LIMIT_CEILING:
        *lim = bc_ceiling_room(q->b, q->H);
        return 0;
    case BC_LIMIT_CAPACITY:
        if (q->firm) {
            firm = bc_firm_limit(q->cap, q->F, q->U, q->unmet);
            *warm = bc_warm_firm(q->free, firm);
            /* a borrowed lease (firm 2, unmet raised by the borrow room, §14.8): free units
               only, never a reclaim */
            *lim = q->firm > 1 ? *warm
                               : bc_min64(bc_reachable(q->free, q->oppa, q->rev, q->prom), firm);
        } else {
            *warm = *lim = bc_warm_opportunistic(q->free, q->headroom);
        }
        return 0;
    case BC_LIMIT_TOKENS:
        if (q->instant) {
            *lim = bc_token_limit_instant(q->H, q->s, q->T);
            return 0;
        }
        if (q->dur == 0)
            return BC_E_ZERODIV;
        if (exact || q->dur < 0) {
            *lim = bc_token_limit(q->H, q->s, q->T, q->dur);
            return 0;
        }
        return BC_LAZY;
    case BC_LIMIT_CREDITS:
        if (!ct->on) {
            *lim = BC_MAXV;
            return 0;
        }
        if (exact || (q->dur < 0) != (q->pm < 0)) {    /* den < 0 */
            *lim = bc_credit_limit(q, ct);
            return 0;
        }
        return BC_LAZY;
    }
    *lim = BC_MAXV;
    return 0;
}

/* Whether rule i (bc_limit gave BC_LAZY) allows m units, without its division (0 when it
 * cannot tell: the caller divides): the tokens' T // dur >= m is T >= m·dur; the credits'
 * L·hour // den >= m (den > 0) is L·hour >= m·den, that is bc_cost(m, dur, pm) <= L. */
static inline int bc_allows(const bc_req *q, const bc_credit *ct, int i, int64_t m)
{
    int64_t mb, need;
    switch (i) {
    case BC_LIMIT_TOKENS:
        /* m - base fits int64 and dur > 0 here, so when the product overflows int64 its
         * sign alone decides */
        mb = m - bc_sustained_room(q->H, q->s);
        return bc_mul_over64(mb, q->dur, &need) ? (mb < 0) : (q->T >= need);
    case BC_LIMIT_CREDITS:
        if (m <= 0)
            return ct->L >= 0;
        if (ct->capped && m > BC_MAXV)
            return 0;
        if (m == q->cn)             /* the cost known (exact) */
            return q->ccost <= ct->L;
        return bc_cost_exact(m, q->dur, q->pm) && bc_cost(m, q->dur, q->pm) <= ct->L;
    }
    return 0;
}

/* bc_size's two passes over rule i, called once per rule with i constant (each rule's case
 * chosen at compile time, its figures in registers): the first takes its limit, or learns it
 * is lazy, and cuts m, the size so far, to each limit it has; the second compares a lazy
 * limit with m and divides it out, cutting m, only when it does not allow m. */
static inline int bc_size_pass1(const bc_req *q, const bc_credit *ct, int i, int exact,
                                const int64_t *xlim, bc_dec *o, int *lazy, int64_t *m)
{
    int rc = bc_limit(q, ct, i, exact, &o->lim[i], &o->warm);
    if (rc < 0)
        return rc;
    lazy[i] = rc == BC_LAZY;
    if (xlim != NULL && !lazy[i] && xlim[i] < o->lim[i])
        o->lim[i] = xlim[i];
    if (!lazy[i])
        *m = bc_min64(*m, o->lim[i]);
    return 0;
}

static inline void bc_size_pass2(const bc_req *q, const bc_credit *ct, int i, bc_dec *o,
                                 int *lazy, int64_t *m)
{
    if (!lazy[i])
        return;
    if (bc_allows(q, ct, i, *m)) {
        o->lim[i] = *m;             /* a lower bound: it does not bind */
    } else {
        o->lim[i] = bc_limit_exact(q, ct, i);
        lazy[i] = 0;
        *m = bc_min64(*m, o->lim[i]);
    }
}

/* §4.4 the size of a request of [nmin, nmax] units: the largest n <= nmax every rule allows
 * (0 if none), and, when it is below nmin, the first rule in BC_LIMIT_* order whose limit
 * held it there. With `exact` 0 a rule whose limit takes a division is divided out only when
 * it may bind; its lim[] then holds a lower bound (n and the reason are always exact).
 * xlim (NULL: none): what other levels of a tree of envelopes allow per rule (§14.2), each
 * rule's limit the smaller of q's and its; with xlim every limit is exact. Sets n, reason,
 * lim and warm of *o; 0 or an error code. */
static inline int bc_size(const bc_req *q, int64_t nmin, int64_t nmax, int exact,
                          const int64_t *xlim, bc_dec *o)
{
    int lazy[BC_LIMITS], i, rc;
    int64_t m = nmax, n;
    bc_credit ct;
    rc = bc_credit_terms(q, &ct);
    if (rc < 0)
        return rc;
    o->warm = 0;                    /* (the capacity rule sets it) */
    if (xlim != NULL)
        exact = 1;
    if ((rc = bc_size_pass1(q, &ct, BC_LIMIT_CEILING, exact, xlim, o, lazy, &m)) < 0
            || (rc = bc_size_pass1(q, &ct, BC_LIMIT_CAPACITY, exact, xlim, o, lazy, &m)) < 0
            || (rc = bc_size_pass1(q, &ct, BC_LIMIT_TOKENS, exact, xlim, o, lazy, &m)) < 0
            || (rc = bc_size_pass1(q, &ct, BC_LIMIT_CREDITS, exact, xlim, o, lazy, &m)) < 0)
        return rc;
    bc_size_pass2(q, &ct, BC_LIMIT_CEILING, o, lazy, &m);
    bc_size_pass2(q, &ct, BC_LIMIT_CAPACITY, o, lazy, &m);
    bc_size_pass2(q, &ct, BC_LIMIT_TOKENS, o, lazy, &m);
    bc_size_pass2(q, &ct, BC_LIMIT_CREDITS, o, lazy, &m);
    o->reason = BC_REASON_NONE;
    if (__builtin_expect(m >= nmax, 1)) {
        /* Every rule allows the whole request (m == nmax): a branch, not a select, so on
         * the predicted path the size is nmax whatever the limits, and the next request,
         * which reads the levels this grant moves, need not wait for these limits. */
        o->n = nmax;
        return 0;
    }
    n = bc_max64(0, m);
    o->n = n;
    if (n < nmin) {
        BC_UNROLL
        for (i = 0; i < BC_LIMITS; i++) {
            if (lazy[i])
                o->lim[i] = bc_limit_exact(q, &ct, i);
            if (o->lim[i] <= n) {
                o->reason = bc_limit_reason[i];
                break;
            }
        }
    }
    return 0;
}

/* §4.4 the first rule, in BC_LIMIT_* order, that a request of exactly n units breaks (its
 * limit below n; the limits exact), or BC_REASON_NONE. */
static inline int64_t bc_first_broken(const int64_t *lim, int64_t n)
{
    int i;
    for (i = 0; i < BC_LIMITS; i++)
        if (lim[i] < n)
            return bc_limit_reason[i];
    return BC_REASON_NONE;
}

/* §4.4 whether rule i could never allow nmin units, whatever the others do: the rule at its
 * most lenient (nothing held; the pool empty but for the others' guarantees, for a firm
 * lease, or the headroom, for an opportunistic one; a full bucket; the escrow refunded). */
static inline int bc_never_allows(const bc_req *q, int i, int64_t nmin)
{
    switch (i) {
    case BC_LIMIT_CEILING:
        return nmin > bc_ceiling_room(q->b, 0);
    case BC_LIMIT_CAPACITY:
        if (q->firm)
            return nmin > bc_firm_limit(q->cap, 0, q->gsum - q->g, 0);
        return nmin > bc_warm_opportunistic(q->cap, q->headroom);
    case BC_LIMIT_TOKENS:
        return !q->instant && (bc_i128)bc_excess(0, nmin, q->s) * q->dur > q->Bcap;
    case BC_LIMIT_CREDITS:
        return q->pm != 0 && q->left < BC_MAXV && !q->free_when_broke
            && bc_cost(nmin, q->dur, q->pm) > (bc_i128)q->left + q->escrow;
    }
    return 0;
}

/* §4.4 the reason a request of nmin units can never be granted (the first rule, in
 * BC_LIMIT_* order, that never allows it), or BC_REASON_NONE. */
static inline int64_t bc_never(const bc_req *q, int64_t nmin)
{
    int i;
    for (i = 0; i < BC_LIMITS; i++)
        if (bc_never_allows(q, i, nmin))
            return bc_limit_reason[i];
    return BC_REASON_NONE;
}

#endif /* BURSARCORE_RULES_H */
