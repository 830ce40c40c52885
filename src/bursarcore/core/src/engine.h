/*
 * The admission engine (docs/spec.md §4–§7): tokens and holdings, congestion and price,
 * the decision, the lease store (grant, activation, end, renewal, expiry) and the batch
 * loop, over one state. Every rule is one inline function here, and every path — a single
 * decision, a batch, a grant, a renewal, a quote, a "never" check — calls the same one;
 * the arithmetic on one campaign's numbers comes from rules.h.
 *
 * The state is a struct of pointers to arrays the caller owns (bc_eng); this header
 * never allocates. A kernel that lacks room returns an error code before changing
 * anything; the caller grows the arrays and calls again.
 *
 * Units (§2): int64 ns, whole units, unit·ns tokens, micro-credits, prices in
 * micro-credits per unit-hour, multipliers in ppm. Compiled with -fwrapv: running
 * counters wrap like numpy's `+=`.
 */
#ifndef BURSARCORE_ENGINE_H
#define BURSARCORE_ENGINE_H

#include <math.h>
#include <stdint.h>

#include "bursarcore.h"
#include "ints.h"
#include "rules.h"

/* --- cdef begin (the codes, records and state as a binding declares them) */
/* class-table columns */
enum { BC_K_RANK, BC_K_MULT, BC_K_PRICED, BC_K_PREEMPT, BC_K_GRACE, BC_K_FREEBROKE, BC_K_NCOL };

/* reason codes, outcomes and lease states: the public header's (bursarcore.h) */

/* grant paths */
enum { BC_P_WARM, BC_P_RECLAIM, BC_P_COLD };

/* errors of the kernels (< 0) */
enum {
    BC_E_LEASES = -1,    /* lease store full */
    BC_E_ARENA = -2,     /* slot arena full */
    BC_E_SLOTS = -3,     /* too few free slots to place */
    BC_E_STACK = -4,     /* ending a lease would overfill the free-slot stack */
    BC_E_HEAPFULL = -5,  /* a push needs a larger expiry heap first (grow and call again) */
    BC_E_ZERODIV = -6,
    BC_E_INDEX = -7,
    BC_E_RANGE = -8,     /* a price that does not fit int64 */
    BC_E_EMPTY = -9,     /* heap pop on an empty heap */
    BC_E_ENDED = -10     /* ending a lease that has already ended */
};

enum {
    BC_ROW_BITS = 32,  /* lease id = row | generation << BC_ROW_BITS */
    BC_REC_WIDTH = 11, /* journal inputs per batch item (k_batch's rec) */
    BC_PF_AHEAD = 6,   /* the batch loop reads the campaign records this far ahead */
    BC_PF_ROWS = 12    /* ... and the lease record this many grants ahead */
};
/* --- cdef end */

#define BC_ROW_MASK ((int64_t)0xFFFFFFFFLL)
#define BC_GEN_MASK ((int64_t)0x3FFFFFFFLL)
#define BC_FS_REBASE 256.0     /* |t - E| in half-lives beyond which the epoch E moves */

/* --- cdef begin */

/* A (campaign, dimension) record, 128 bytes, the fields a grant touches in the first
 * line: last settlement, holding, tokens, sustained rate, burst ceiling, bucket size,
 * ∫H dt, guarantee, firm holding, and token counters. */
typedef struct {
    int64_t tlast, H, T, s, b, Bcap, acc, tok_debited;
    int64_t g, Hf, tok_minted, tok_refunded, tok_clipped, pad0, pad1, pad2;
} bc_cdrow;

/* A campaign's record, 64 bytes: credits, then its fair-share pair (§6) as doubles. */
typedef struct {
    int64_t left, escrow, cred_debited, budget, spent, refunded;
    double fsS, fsG;
} bc_crow;

/* A lease's record, 128 bytes. */
typedef struct {
    int64_t camp, dim, units, firm, state, lcls, t_end, slot_off;
    int64_t t_grant, t_start, dur, excess, cost, revoke_at, intent, gen;
} bc_lrow;

/* The state. Scalars are `long long` rather than int64_t (`long`), so that under strict
 * aliasing a store through an int64_t* cannot change them and they stay in registers.
 * scal = [congestion bin, instant enforcement, lease high-water mark, heap size]. */
typedef struct {
    long long D, K, NT, bins, W, calloc, L, A, HC;
    long long bin_ns;
    /* pool, per dimension */
    int64_t *cap, *headroom, *occ, *prom, *rev, *F, *U, *oppa, *pend, *price, *gsum;
    int64_t *cls, *cong_thr, *cong_mult, *ring, *ring_sum, *scal;
    int32_t *free_slots;
    int64_t *top;
    /* campaigns: one record per (campaign, dimension), one per campaign */
    bc_cdrow *cd;
    bc_crow *cr;
    int64_t *fs_par;           /* [half-life ns, epoch ns] */
    long long fs_t;            /* cache: the last time fs_weight computed, and its weight */
    double fs_w;
    int fs_ok;
    /* leases: one record per row */
    bc_lrow *lr;
    int64_t *freeq;            /* ring of ended rows (length L) */
    int64_t *lfree;            /* [head, tail, reuse_after] */
    int32_t *arena;
    int64_t *arena_top;
    int64_t *heap_t, *heap_id;
} bc_eng;

/* --- cdef end */

/* A decision and the limits that made it (§4.4). */
typedef struct {
    int64_t n, reason, path, pm, lim_ceil, lim_cap, lim_tok;
    bc_i128 lim_cred;
    int64_t lim_warm;
} bc_dec;

/* What a batch remembers between its items: the last price while nothing in the batch can
 * move it (an unpriced class, no congestion table, or no priced demand), and the last
 * cost. d < 0: no price remembered; cn < 0: no cost. */
typedef struct {
    int64_t d, k, pm;
    int64_t cn, cdur, cpm;
    bc_i128 ccost;
} bc_memo;

static inline void k_memo_init(bc_memo *mo)
{
    mo->d = mo->k = mo->pm = -1;
    mo->cn = mo->cdur = mo->cpm = -1;
    mo->ccost = 0;
}

static inline int k_mul_over(bc_i128 a, bc_i128 b, bc_i128 *r)
{
    return __builtin_mul_overflow(a, b, r);
}

static inline int k_mul_over64(int64_t a, int64_t b, int64_t *r)
{
    return __builtin_mul_overflow(a, b, r);
}

/* -- tokens and holdings (§4.2) ----------------------------------------------------------- */

/* Bring (c, d)'s bucket and its ∫H dt to time t. */
static inline void k_settle(bc_eng *e, int64_t c, int64_t d, int64_t t)
{
    int64_t i = c * e->D + d;
    int64_t tl = e->cd[i].tlast, H, rate, T;
    bc_i128 dt, add, room;
    if (tl >= t)
        return;
    dt = (bc_i128)t - tl;
    e->cd[i].tlast = t;
    H = e->cd[i].H;
    /* the low 64 bits of H * dt: the wrapping 64-bit product */
    e->cd[i].acc = (int64_t)((uint64_t)e->cd[i].acc + (uint64_t)H * ((uint64_t)t - (uint64_t)tl));
    rate = e->cd[i].s - H;
    T = e->cd[i].T;
    if (rate > 0) {
        room = (bc_i128)e->cd[i].Bcap - T;
        if (room == 0)              /* a full bucket (or an unlimited one): nothing to add */
            return;
        add = (bc_i128)rate * dt;
        if (room < add)
            add = room;
        e->cd[i].T = (int64_t)(T + add);
        e->cd[i].tok_minted = bc_wadd(e->cd[i].tok_minted, add);
    } else if (rate < 0 && e->scal[1] != 0) {
        add = -((bc_i128)rate) * dt;
        if (add > T)
            add = T;
        e->cd[i].T = (int64_t)(T - add);
        e->cd[i].tok_debited = bc_wadd(e->cd[i].tok_debited, add);
    }
}

static inline int64_t k_unmet(const bc_eng *e, int64_t c, int64_t d)
{
    int64_t i = c * e->D + d;
    return bc_unmet(e->cd[i].g, e->cd[i].Hf);
}

static inline int64_t k_free(const bc_eng *e, int64_t d)
{
    return bc_free(e->cap[d], e->occ[d], e->prom[d], e->rev[d]);
}

/* §6 the fair-share weight 2^((t - E)/half-life), moving the epoch E to t when t is more
 * than BC_FS_REBASE half-lives ahead. Cached per t (a batch's grants share one t), and
 * the cache dropped when the epoch moves. */
static inline double k_fs_weight(bc_eng *e, int64_t t)
{
    double x, f;
    int64_t c;
    if (e->fs_ok && e->fs_t == t)
        return e->fs_w;
    x = (double)(t - e->fs_par[1]) / (double)e->fs_par[0];
    if (x > BC_FS_REBASE) {
        f = pow(2.0, -x);
        for (c = 0; c < e->calloc; c++) {
            e->cr[c].fsS = e->cr[c].fsS * f;
            e->cr[c].fsG = e->cr[c].fsG * f;
        }
        e->fs_par[1] = t;
        x = 0.0;
    }
    e->fs_w = pow(2.0, x);
    e->fs_t = t;
    e->fs_ok = 1;
    return e->fs_w;
}

/* Change (c, d)'s holding by delta (firm: also its firm holding, F and U), folding the
 * holding so far into c's fair-share usage (the caller settled: tlast is now). */
static inline void k_hold(bc_eng *e, int64_t c, int64_t d, int64_t delta, int firm)
{
    int64_t i = c * e->D + d, before;
    double w;
    if (d == 0) {
        w = (e->fs_ok && e->fs_t == e->cd[i].tlast) ? e->fs_w : k_fs_weight(e, e->cd[i].tlast);
        e->cr[c].fsS = e->cr[c].fsS + (double)e->cd[i].H * (w - e->cr[c].fsG);
        e->cr[c].fsG = w;
    }
    e->cd[i].H += delta;
    if (firm) {
        before = k_unmet(e, c, d);
        e->cd[i].Hf += delta;
        e->F[d] += delta;
        e->U[d] += k_unmet(e, c, d) - before;
    }
}

/* -- congestion and price (§7) ------------------------------------------------------------ */

static inline void k_ring_advance(bc_eng *e, int64_t t)
{
    int64_t bn = bc_fdiv64(t, e->bin_ns), cur = e->scal[0], steps, j, k, d;
    if (bn <= cur)
        return;
    steps = ((bc_i128)bn - cur < e->bins) ? (int64_t)((bc_i128)bn - cur) : e->bins;
    for (d = 0; d < e->D; d++) {
        for (j = 1; j < steps + 1; j++) {
            k = bc_fmod64(cur + j, e->bins);
            e->ring_sum[d] -= e->ring[d * e->bins + k];
            e->ring[d * e->bins + k] = 0;
        }
    }
    e->scal[0] = bn;
}

static inline bc_i128 k_cong_ppm(const bc_eng *e, int64_t d)
{
    return bc_fdiv128(((bc_i128)e->ring_sum[d] + e->pend[d]) * BC_PPM, bc_max64(1, k_free(e, d)));
}

/* The congestion multiplier with the free capacity known: κ < thr <=> num < thr·den
 * (den >= 1), no division needed. */
static inline int64_t k_cong_mult_f(const bc_eng *e, int64_t d, int64_t free)
{
    bc_i128 dem = (bc_i128)e->ring_sum[d] + e->pend[d], num, den;
    int64_t i;
    if (dem == 0 && (e->NT == 0 || e->cong_thr[0] > 0))
        return e->cong_mult[0];      /* no demand: 0 < thr[0]·den for any den >= 1 */
    num = dem * BC_PPM;
    den = bc_max64(1, free);
    for (i = 0; i < e->NT; i++)
        if (num < e->cong_thr[i] * den)
            return e->cong_mult[i];
    return e->cong_mult[e->NT];
}

static inline int64_t k_cong_mult(const bc_eng *e, int64_t d)
{
    return k_cong_mult_f(e, d, k_free(e, d));
}

/* The price of class k on dimension d with the free capacity known. */
static inline bc_i128 k_price_f(const bc_eng *e, int64_t d, int64_t k, int64_t free)
{
    const int64_t *kc = e->cls + k * BC_K_NCOL;
    bc_i128 m = kc[BC_K_MULT];
    int64_t cm;
    if (kc[BC_K_PRICED] != 0) {
        cm = k_cong_mult_f(e, d, free);
        if (cm != BC_PPM)                  /* (x·PPM) // PPM is x: skip the division */
            m = bc_fdiv_ppm(m * cm);
    }
    if (m == BC_PPM)
        return e->price[d];
    return bc_fdiv_ppm((bc_i128)e->price[d] * m);
}

static inline bc_i128 k_price(const bc_eng *e, int64_t d, int64_t k)
{
    return k_price_f(e, d, k, k_free(e, d));
}

/* Whether class row kc's price on d cannot move until priced demand is added: an
 * unpriced class, no congestion table, or no demand below the first threshold. */
static inline int k_price_fixed(const bc_eng *e, int64_t d, const int64_t *kc)
{
    return kc[BC_K_PRICED] == 0 || e->NT == 0
        || ((bc_i128)e->ring_sum[d] + e->pend[d] == 0 && e->cong_thr[0] > 0);
}

static inline void k_shortfall(bc_eng *e, int64_t d, int64_t units)
{
    int64_t k = bc_fmod64(e->scal[0], e->bins);
    e->ring[d * e->bins + k] += units;
    e->ring_sum[d] += units;
}

/* Priced demand that a batch's remembered price must not outlive. */
static inline void k_shortfall_m(bc_eng *e, int64_t d, int64_t units, bc_memo *mo)
{
    k_shortfall(e, d, units);
    if (mo != NULL)
        mo->d = -1;
}

/* The charge of a lease of class row kc priced `price` to campaign c (§7). */
static inline bc_i128 k_charge(const bc_eng *e, int64_t c, const int64_t *kc, bc_i128 price)
{
    return bc_charge(kc[BC_K_FREEBROKE] != 0, price, e->cr[c].left);
}

/* -- the decision (§4.4) ------------------------------------------------------------------ */

/* Decide a request of [nmin, nmax] units of class k on (c, d) for dur ns at t, spending at
 * most max_spend micro-credits (< 0: no cap). With `exact` false the token and credit
 * limits are only divided out when they may bind (T // dur >= q is T >= q·dur, X // den >= q
 * is X >= q·den); n, reason, path, pm and the capacity limits are always exact, lim_tok /
 * lim_cred then hold lower bounds. Returns 0 or an error code. */
static inline int k_decide(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t nmin,
                           int64_t nmax, int64_t dur, int64_t max_spend, int64_t t,
                           int exact, bc_dec *o, bc_memo *mo)
{
    int64_t i = c * e->D + d;
    const int64_t *kc = e->cls + k * BC_K_NCOL;
    int firm, tok_lazy = 0, cred_lazy = 0, capped = 0, ok;
    int64_t H, s, T, base, free, lim_firm, lim_warm, m, n, left, need, mb;
    bc_i128 pm, den = 0, X = 0, prod;
    k_settle(e, c, d, t);
    firm = kc[BC_K_PREEMPT] == 0;
    H = e->cd[i].H;
    s = e->cd[i].s;
    o->lim_ceil = bc_ceiling_room(e->cd[i].b, H);
    T = e->cd[i].T;
    base = bc_sustained_room(H, s);
    if (e->scal[1] != 0)
        o->lim_tok = T > 0 ? BC_MAXV : base;
    else if (dur == 0)
        return BC_E_ZERODIV;
    else if (exact || dur < 0)
        o->lim_tok = base + bc_fdiv64(T, dur);
    else
        tok_lazy = 1;
    free = k_free(e, d);
    if (mo != NULL && mo->d == d && mo->k == k) {
        pm = mo->pm;
    } else {
        pm = k_price_f(e, d, k, free);
        if (pm > BC_I64_MAX || pm < BC_I64_MIN)
            return BC_E_RANGE;
        if (mo != NULL && k_price_fixed(e, d, kc)) {
            mo->d = d;
            mo->k = k;
            mo->pm = (int64_t)pm;
        }
    }
    o->pm = (int64_t)pm;
    o->lim_cred = BC_MAXV;
    if (pm != 0) {
        den = (bc_i128)dur * pm;
        left = e->cr[c].left;
        if (kc[BC_K_FREEBROKE] == 0) {    /* (an unlimited budget, left = MAXV, bounds a cost too) */
            if (den == 0)
                return BC_E_ZERODIV;
            X = (bc_i128)left * BC_HOUR_NS;
            cred_lazy = 1;
        }
        if (max_spend >= 0) {
            if (den == 0)
                return BC_E_ZERODIV;
            /* min(X1 // den, X2 // den) == min(X1, X2) // den; min(BIG, X2 // den) otherwise */
            capped = !cred_lazy;
            if (capped || (bc_i128)max_spend * BC_HOUR_NS < X)
                X = (bc_i128)max_spend * BC_HOUR_NS;
            cred_lazy = 1;
        }
        if (cred_lazy && (exact || den < 0)) {
            o->lim_cred = bc_fdiv128(X, den);
            if (capped && o->lim_cred > BC_MAXV)
                o->lim_cred = BC_MAXV;
            cred_lazy = 0;
        }
    }
    if (firm) {
        lim_firm = bc_firm_limit(e->cap[d], e->F[d], e->U[d], k_unmet(e, c, d));
        lim_warm = bc_warm_firm(free, lim_firm);
        o->lim_cap = bc_min64(bc_reachable(free, e->oppa[d], e->rev[d], e->prom[d]), lim_firm);
    } else {
        lim_warm = bc_warm_opportunistic(free, e->headroom[d]);
        o->lim_cap = lim_warm;
    }
    o->lim_warm = lim_warm;
    m = bc_min64(bc_min64(nmax, o->lim_ceil), o->lim_cap);
    if (tok_lazy) {
        /* lim_tok >= m (it does not bind) iff T >= (m - base)·dur; m - base fits int64 and
         * dur > 0 here, so when the product overflows int64 its sign alone decides */
        mb = m - base;
        if (k_mul_over64(mb, dur, &need) ? (mb < 0) : (T >= need)) {
            o->lim_tok = m;
        } else {
            o->lim_tok = base + bc_fdiv64(T, dur);
            tok_lazy = 0;
        }
    }
    m = bc_min64(m, o->lim_tok);
    if (cred_lazy) {
        if (m <= 0)
            ok = X >= 0;
        else
            ok = (!capped || m <= BC_MAXV) && !k_mul_over(m, den, &prod) && X >= prod;
        if (ok) {
            o->lim_cred = m;
        } else {
            o->lim_cred = bc_fdiv128(X, den);
            if (capped && o->lim_cred > BC_MAXV)
                o->lim_cred = BC_MAXV;
            cred_lazy = 0;
        }
    }
    if (o->lim_cred < m)
        m = (int64_t)o->lim_cred;
    n = bc_max64(0, m);
    o->n = n;
    o->reason = BC_REASON_NONE;
    if (n < nmin) {
        if (o->lim_ceil <= n) {
            o->reason = BC_REASON_CEILING;
        } else if (o->lim_cap <= n) {
            o->reason = BC_REASON_CAPACITY;
        } else {
            if (tok_lazy)
                o->lim_tok = base + bc_fdiv64(T, dur);
            if (o->lim_tok <= n) {
                o->reason = BC_REASON_TOKENS;
            } else {
                if (cred_lazy) {
                    o->lim_cred = bc_fdiv128(X, den);
                    if (capped && o->lim_cred > BC_MAXV)
                        o->lim_cred = BC_MAXV;
                }
                if (o->lim_cred <= n)
                    o->reason = BC_REASON_CREDITS;
            }
        }
    }
    o->path = n <= lim_warm ? BC_P_WARM : BC_P_RECLAIM;
    return 0;
}

/* Whether a request of nmin units could never be granted, whatever the others do: each
 * rule at its most lenient (nothing held, the pool empty but for the others' guarantees
 * for a firm lease, or the headroom for an opportunistic one). The reason, or BC_REASON_NONE. */
static inline int64_t k_never(const bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t nmin,
                              int64_t dur, int64_t pm)
{
    int64_t i = c * e->D + d, left;
    const int64_t *kc = e->cls + k * BC_K_NCOL;
    if (nmin > bc_ceiling_room(e->cd[i].b, 0))
        return BC_REASON_CEILING;
    if (kc[BC_K_PREEMPT] != 0) {
        if (nmin > bc_warm_opportunistic(e->cap[d], e->headroom[d]))
            return BC_REASON_CAPACITY;
    } else if (nmin > bc_firm_limit(e->cap[d], 0, e->gsum[d] - e->cd[i].g, 0)) {
        return BC_REASON_CAPACITY;
    }
    if (e->scal[1] == 0 && (bc_i128)bc_excess(0, nmin, e->cd[i].s) * dur > e->cd[i].Bcap)
        return BC_REASON_TOKENS;
    left = e->cr[c].left;
    if (pm != 0 && left < BC_MAXV && kc[BC_K_FREEBROKE] == 0
            && bc_cost(nmin, dur, pm) > (bc_i128)left + e->cr[c].escrow)
        return BC_REASON_CREDITS;
    return BC_REASON_NONE;
}

/* -- expiry heap: a binary heap of (time, lease id) ------------------------------------ */

static inline int k_before(int64_t at, int64_t aid, int64_t bt, int64_t bid)
{
    return at < bt || (at == bt && aid < bid);
}

/* Push (t, lid); the caller checked scal[3] < HC. Parents slide down into a hole. */
static inline void k_heap_push(bc_eng *e, int64_t t, int64_t lid)
{
    int64_t i = e->scal[3], p;
    int64_t *ht = e->heap_t, *hi = e->heap_id;
    e->scal[3] = i + 1;
    while (i > 0) {
        p = (i - 1) / 2;
        if (!k_before(t, lid, ht[p], hi[p]))
            break;
        ht[i] = ht[p];
        hi[i] = hi[p];
        i = p;
    }
    ht[i] = t;
    hi[i] = lid;
}

/* Pop the top; the caller checked scal[3] > 0. Sift-down with a hole. */
static inline void k_heap_pop(bc_eng *e)
{
    int64_t n = e->scal[3] - 1, i = 0, lo, r, m;
    int64_t *ht = e->heap_t, *hi = e->heap_id;
    int64_t xt = ht[n], xid = hi[n], mt, mid;
    e->scal[3] = n;
    for (;;) {
        lo = 2 * i + 1;
        if (lo >= n)
            break;
        m = lo;
        mt = ht[lo];
        mid = hi[lo];
        r = lo + 1;
        if (r < n && k_before(ht[r], hi[r], mt, mid)) {
            m = r;
            mt = ht[r];
            mid = hi[r];
        }
        if (!k_before(mt, mid, xt, xid))
            break;
        ht[i] = mt;
        hi[i] = mid;
        i = m;
    }
    ht[i] = xt;
    hi[i] = xid;
}

/* -- leases (§4.2, §4.3, §4.6) ----------------------------------------------------------- */

/* Whether the next grant takes an ended row: more than reuse_after wait. */
static inline int k_reusable(const bc_eng *e)
{
    return e->lfree[2] >= 0 && e->lfree[1] - e->lfree[0] > e->lfree[2];
}

/* The row the lease `a` new leases on takes, if none ends before. */
static inline int64_t k_row_ahead(const bc_eng *e, int64_t a)
{
    int64_t q = e->lfree[1] - e->lfree[0] - e->lfree[2], h;
    if (e->lfree[2] < 0 || q <= 0)
        return e->scal[2] + a;
    if (q > a) {
        h = e->lfree[0] + a;
        return e->freeq[h % e->L];
    }
    return e->scal[2] + a - q;
}

/* The id of a new lease: the oldest reusable ended row (its generation moved on), or the
 * next unused row (the caller checked there is one). */
static inline int64_t k_new_row(bc_eng *e)
{
    int64_t r, g;
    if (k_reusable(e)) {
        r = e->freeq[e->lfree[0] % e->L];
        e->lfree[0] += 1;
        g = (e->lr[r].gen + 1) & BC_GEN_MASK;
        e->lr[r].gen = g;
        return r | (g << BC_ROW_BITS);
    }
    r = e->scal[2];        /* an unused row: generation 0, so its id is the row */
    e->scal[2] = r + 1;
    return r;
}

/* Take a row and write a new lease's record to it; its id. Placement is the caller's. */
static inline int64_t k_new_lease(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t n,
                                  int firm, int64_t state, int64_t t, int64_t dur,
                                  int64_t excess, int64_t cost, int64_t intent)
{
    int64_t lid = k_new_row(e), r = lid & BC_ROW_MASK;
    e->lr[r].camp = c;
    e->lr[r].dim = d;
    e->lr[r].units = n;
    e->lr[r].firm = firm;
    e->lr[r].state = state;
    e->lr[r].lcls = k;
    e->lr[r].t_grant = t;
    e->lr[r].dur = dur;
    e->lr[r].excess = excess;
    e->lr[r].cost = cost;
    e->lr[r].intent = intent;
    e->lr[r].revoke_at = 0;
    return lid;
}

/* Queue an ended lease's row for reuse. */
static inline void k_free_row(bc_eng *e, int64_t r)
{
    if (e->lfree[2] >= 0) {
        e->freeq[e->lfree[1] % e->L] = r;
        e->lfree[1] += 1;
    }
}

/* The row of lease lid, or -1 if out of range or stale (its row holds a later lease). */
static inline int64_t k_row(const bc_eng *e, int64_t lid)
{
    int64_t r = lid & BC_ROW_MASK;
    if (lid < 0 || r >= e->L || e->lr[r].gen != (lid >> BC_ROW_BITS))
        return -1;
    return r;
}

/* Whether there is room for `leases` new leases and, if placed, n slots on d (0: room). */
static inline int k_room(const bc_eng *e, int64_t d, int64_t n, int64_t leases, int place)
{
    if (e->scal[2] + leases > e->L && !(leases == 1 && k_reusable(e)))
        return BC_E_LEASES;
    if (place) {
        if (e->arena_top[0] + n > e->A)
            return BC_E_ARENA;
        if (n > e->top[d])
            return BC_E_SLOTS;
    }
    return 0;
}

/* Place lease lid's n units on slots of d at t: active, ending at t + dur. */
static inline void k_place(bc_eng *e, int64_t lid, int64_t d, int64_t n, int64_t t)
{
    int64_t off = e->arena_top[0], top = e->top[d], j, r = lid & BC_ROW_MASK;
    const int32_t *fs = e->free_slots + d * e->W + top - 1;
    int32_t *ar = e->arena + off;
    if (n > 0) {          /* the first two by hand: no vectorised prologue for a small lease */
        ar[0] = fs[0];
        if (n > 1) {
            ar[1] = fs[-1];
            for (j = 2; j < n; j++)
                ar[j] = fs[-j];
        }
    }
    e->top[d] = top - n;
    e->arena_top[0] = off + n;
    e->lr[r].slot_off = off;
    e->occ[d] += n;
    if (e->lr[r].firm == 0)
        e->oppa[d] += n;
    e->lr[r].state = BC_LEASE_ACTIVE;
    e->lr[r].t_start = t;
    e->lr[r].t_end = t + e->lr[r].dur;
    k_heap_push(e, t + e->lr[r].dur, lid);
}

/* Commit a grant whose checks passed (room, heap) with (c, d) settled at t and its cost at
 * its price known (`price` = bc_cost(n, dur, pm)): debit the tokens above the sustained
 * rate and the charge, hold the units, write the lease, place it unless it is starting.
 * The lease id. */
static inline int64_t k_commit_cost(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t n,
                                    int64_t dur, bc_i128 price, int64_t t, int starting,
                                    int64_t intent)
{
    int64_t i = c * e->D + d;
    const int64_t *kc = e->cls + k * BC_K_NCOL;
    int firm = kc[BC_K_PREEMPT] == 0;
    int64_t H = e->cd[i].H, s = e->cd[i].s, excess, lid, r;
    bc_i128 debit;
    excess = e->scal[1] != 0 ? 0 : bc_excess(H, n, s);
    if (excess != 0) {     /* (a lease within the sustained rate leaves the bucket as it is) */
        debit = (bc_i128)excess * dur;
        e->cd[i].T = bc_wadd(e->cd[i].T, -debit);
        e->cd[i].tok_debited = bc_wadd(e->cd[i].tok_debited, debit);
    }
    price = k_charge(e, c, kc, price);
    if (price != 0) {      /* (a free lease leaves the credit sums as they are) */
        if (e->cr[c].left < BC_MAXV)
            e->cr[c].left = bc_wadd(e->cr[c].left, -price);
        e->cr[c].escrow = bc_wadd(e->cr[c].escrow, price);
        e->cr[c].cred_debited = bc_wadd(e->cr[c].cred_debited, price);
    }
    k_hold(e, c, d, n, firm);
    lid = k_new_lease(e, c, d, k, n, firm, starting ? BC_LEASE_STARTING : BC_LEASE_ACTIVE, t, dur,
                      excess, (int64_t)price, intent);
    r = lid & BC_ROW_MASK;
    if (starting) {
        e->prom[d] += n;
        e->lr[r].t_start = 0;
        e->lr[r].t_end = 0;
        e->lr[r].slot_off = -1;
    } else {
        k_place(e, lid, d, n, t);
    }
    return lid;
}

static inline int64_t k_commit(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t n,
                               int64_t dur, int64_t pm, int64_t t, int starting, int64_t intent,
                               bc_memo *mo)
{
    bc_i128 price;
    if (mo == NULL)
        return k_commit_cost(e, c, d, k, n, dur, bc_cost(n, dur, pm), t, starting, intent);
    if (n != mo->cn || dur != mo->cdur || pm != mo->cpm) {
        mo->cn = n;
        mo->cdur = dur;
        mo->cpm = pm;
        mo->ccost = bc_cost(n, dur, pm);
    }
    price = mo->ccost;
    return k_commit_cost(e, c, d, k, n, dur, price, t, starting, intent);
}

/* Grant n units of class k to (c, d) for dur at price pm: the lease id, or an error code
 * before any change. */
static inline int64_t k_grant(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t n,
                              int64_t dur, int64_t pm, int64_t t, int starting, int64_t intent)
{
    int err = k_room(e, d, n, 1, !starting);
    if (err)
        return err;
    if (!starting && e->scal[3] >= e->HC)
        return BC_E_HEAPFULL;
    k_settle(e, c, d, t);
    return k_commit(e, c, d, k, n, dur, pm, t, starting, intent, NULL);
}

/* A starting lease becomes active at t: placed on its slots. */
static inline int k_activate(bc_eng *e, int64_t lid, int64_t t)
{
    int64_t d = e->lr[lid & BC_ROW_MASK].dim, n = e->lr[lid & BC_ROW_MASK].units;
    int err;
    if (d < 0 || d >= e->D)
        return BC_E_INDEX;
    err = k_room(e, d, n, 0, 1);
    if (err)
        return err;
    if (e->scal[3] >= e->HC)
        return BC_E_HEAPFULL;
    e->prom[d] -= n;
    k_place(e, lid, d, n, t);
    return 0;
}

/* End lease lid at t in new_state (the caller checked it is current: k_row): free its
 * slots, refund the tokens and credits of its unused time (§4.2, §7), and queue its row
 * for reuse. */
static inline int k_end_lease(bc_eng *e, int64_t lid, int64_t t, int64_t new_state)
{
    int64_t r = lid & BC_ROW_MASK;
    int64_t c = e->lr[r].camp, d = e->lr[r].dim, i;
    int64_t n = e->lr[r].units, state = e->lr[r].state, dur, off, top, j, price, T;
    int firm = e->lr[r].firm != 0;
    bc_i128 remaining, refund, room, got, back;
    const int32_t *ar;
    int32_t *fs;
    if (state != BC_LEASE_STARTING && state != BC_LEASE_ACTIVE && state != BC_LEASE_REVOKING)
        return BC_E_ENDED;
    if (c < 0 || c >= e->calloc || d < 0 || d >= e->D)
        return BC_E_INDEX;
    if (state != BC_LEASE_STARTING) {
        if (e->top[d] + n > e->W)
            return BC_E_STACK;
        if (e->lr[r].slot_off < 0 || e->lr[r].slot_off + n > e->A)
            return BC_E_INDEX;
    }
    i = c * e->D + d;
    k_settle(e, c, d, t);
    dur = e->lr[r].dur;
    if (state == BC_LEASE_STARTING) {
        remaining = dur;
        e->prom[d] -= n;
    } else {
        remaining = (bc_i128)e->lr[r].t_end - t;
        if (remaining < 0)
            remaining = 0;
        e->occ[d] -= n;
        if (state == BC_LEASE_REVOKING)
            e->rev[d] -= n;
        else if (!firm)
            e->oppa[d] -= n;
        off = e->lr[r].slot_off;
        top = e->top[d];
        fs = e->free_slots + d * e->W + top;
        ar = e->arena + off + n - 1;
        for (j = 0; j < n; j++)
            fs[j] = ar[-j];
        e->top[d] = top + n;
    }
    refund = (bc_i128)e->lr[r].excess * remaining;
    T = e->cd[i].T;
    room = (bc_i128)e->cd[i].Bcap - T;
    got = refund < room ? refund : room;
    e->cd[i].T = bc_wadd(T, got);
    e->cd[i].tok_refunded = bc_wadd(e->cd[i].tok_refunded, got);
    e->cd[i].tok_clipped = bc_wadd(e->cd[i].tok_clipped, refund > room ? refund - room : 0);
    price = e->lr[r].cost;
    if (dur == 0)
        return BC_E_ZERODIV;
    back = remaining == 0 ? 0 : bc_fdiv128((bc_i128)price * remaining, dur);
    if (e->cr[c].left < BC_MAXV)
        e->cr[c].left = bc_wadd(e->cr[c].left, back);
    e->cr[c].escrow = bc_wadd(e->cr[c].escrow, -(bc_i128)price);
    e->cr[c].refunded = bc_wadd(e->cr[c].refunded, back);
    e->cr[c].spent = bc_wadd(e->cr[c].spent, (bc_i128)price - back);
    k_hold(e, c, d, -n, firm);
    e->lr[r].state = new_state;
    k_free_row(e, r);
    return 0;
}

/* Extend lease lid by ext ns at t (§4.3), spending at most max_spend (< 0: no cap). A reason
 * code (>= 0) or an error code (< 0); the price in price_out. The caller checked lid. */
static inline int k_renew(bc_eng *e, int64_t lid, int64_t ext, int64_t t, int64_t max_spend,
                          bc_i128 *price_out)
{
    int64_t r = lid & BC_ROW_MASK;
    int64_t c = e->lr[r].camp, d = e->lr[r].dim, k = e->lr[r].lcls, i;
    int64_t n = e->lr[r].units, end, H, s, ex_new, left;
    bc_i128 new_end, delta, pm, price, room, got;
    const int64_t *kc;
    if (c < 0 || c >= e->calloc || d < 0 || d >= e->D || k < 0 || k >= e->K)
        return BC_E_INDEX;
    i = c * e->D + d;
    kc = e->cls + k * BC_K_NCOL;
    k_settle(e, c, d, t);
    end = e->lr[r].t_end;
    H = e->cd[i].H;
    s = e->cd[i].s;
    new_end = (bc_i128)end + ext;
    *price_out = 0;
    if (e->scal[1] != 0) {
        ex_new = 0;
        delta = 0;
    } else {
        ex_new = bc_excess(H - n, n, s);     /* the lease's n units as the top-most held */
        delta = (bc_i128)ex_new * (new_end - t) - (bc_i128)e->lr[r].excess * ((bc_i128)end - t);
        if (delta > e->cd[i].T)
            return BC_REASON_TOKENS;
    }
    pm = k_price(e, d, k);
    if (pm > BC_I64_MAX || pm < BC_I64_MIN)
        return BC_E_RANGE;
    price = bc_cost(n, ext, (int64_t)pm);
    left = e->cr[c].left;
    price = k_charge(e, c, kc, price);
    *price_out = price;
    if (price > left)            /* (an unlimited budget, left = MAXV, bounds a cost too) */
        return BC_REASON_CREDITS;
    if (0 <= max_spend && max_spend < price)
        return BC_REASON_CREDITS;
    if (e->scal[3] >= e->HC)
        return BC_E_HEAPFULL;
    if (delta >= 0) {
        e->cd[i].T = bc_wadd(e->cd[i].T, -delta);
        e->cd[i].tok_debited = bc_wadd(e->cd[i].tok_debited, delta);
    } else {
        room = (bc_i128)e->cd[i].Bcap - e->cd[i].T;
        got = -delta < room ? -delta : room;
        e->cd[i].T = bc_wadd(e->cd[i].T, got);
        e->cd[i].tok_refunded = bc_wadd(e->cd[i].tok_refunded, got);
        e->cd[i].tok_clipped = bc_wadd(e->cd[i].tok_clipped, -delta > room ? -delta - room : 0);
    }
    e->lr[r].excess = ex_new;
    if (left < BC_MAXV)
        e->cr[c].left = bc_wadd(e->cr[c].left, -price);
    e->cr[c].escrow = bc_wadd(e->cr[c].escrow, price);
    e->cr[c].cred_debited = bc_wadd(e->cr[c].cred_debited, price);
    e->lr[r].cost = bc_wadd(e->lr[r].cost, price);
    e->lr[r].dur += ext;
    e->lr[r].t_end = (int64_t)new_end;
    k_heap_push(e, (int64_t)new_end, lid);
    return BC_REASON_NONE;
}

/* Expire every lease due by t, up to outlen of them, in (time, id) order; their ids in
 * out. The count; an error code in *err (then the count so far). */
static inline int64_t k_advance(bc_eng *e, int64_t t, int64_t *out, int64_t outlen, int *err)
{
    int64_t m = 0, te, lid, s, row;
    int r;
    while (e->scal[3] > 0 && e->heap_t[0] <= t && m < outlen) {
        te = e->heap_t[0];
        lid = e->heap_id[0];
        k_heap_pop(e);
        row = lid & BC_ROW_MASK;
        if (lid < 0 || row >= e->L) {
            *err = BC_E_INDEX;
            return m;
        }
        s = e->lr[row].state;
        if (e->lr[row].gen == (lid >> BC_ROW_BITS) && (s == BC_LEASE_ACTIVE || s == BC_LEASE_REVOKING)
                && e->lr[row].t_end == te) {
            r = k_end_lease(e, lid, te, BC_LEASE_EXPIRED);
            if (r < 0) {
                *err = r;
                return m;
            }
            out[m] = lid;
            m += 1;
        }
    }
    return m;
}

/* -- answers without a change (§4.1, §4.2, §4.4, §7) ------------------------------------ */

/* Σ_c g[c, d] for every d into e->gsum (k_never's "the others' guarantees"). */
static inline void k_sum_guarantees(bc_eng *e, int64_t C)
{
    int64_t i, j;
    for (j = 0; j < e->D; j++) {
        e->gsum[j] = 0;
        for (i = 0; i < C; i++)
            e->gsum[j] += e->cd[i * e->D + j].g;
    }
}

/* Dimension d's capacity levels: free units above the warm headroom, units a reclaim
 * can reach, and the firm room. */
static inline void k_dim_figures(const bc_eng *e, int64_t d, int64_t *out)
{
    int64_t free = k_free(e, d);
    out[0] = bc_warm_opportunistic(free, e->headroom[d]);
    out[1] = bc_reachable(free, e->oppa[d], e->rev[d], e->prom[d]);
    out[2] = bc_firm_limit(e->cap[d], e->F[d], e->U[d], 0);
}

/* ns until (c, d)'s bucket holds the tokens n more units for dur ns need, refilling at
 * s - H; -1 when it holds them now or never refills. The caller settled the bucket. */
static inline bc_i128 k_token_wait(const bc_eng *e, int64_t c, int64_t d, int64_t n, int64_t dur)
{
    int64_t i = c * e->D + d, H = e->cd[i].H, s = e->cd[i].s;
    bc_i128 need = (bc_i128)bc_excess(H, n, s) * dur - e->cd[i].T;
    if (e->scal[1] != 0 || s - H <= 0 || need <= 0)
        return -1;
    return (need + (s - H) - 1) / (s - H);
}

/* One cell of a quote: an intent for exactly n units for dur ns, decided as acquire would
 * decide it, changing nothing but the settled bucket. Its charge, path and reason; 0 or an
 * error code. */
static inline int k_quote_cell(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t n,
                               int64_t dur, int64_t t, bc_i128 *charge, int64_t *path,
                               int64_t *reason)
{
    bc_dec r;
    int err = k_decide(e, c, d, k, n, n, dur, -1, t, 1, &r, NULL);
    if (err)
        return err;
    *charge = k_charge(e, c, e->cls + k * BC_K_NCOL, bc_cost(n, dur, r.pm));
    *path = n <= r.lim_warm ? BC_P_WARM : n <= r.lim_cap ? BC_P_RECLAIM : BC_P_COLD;
    *reason = r.lim_ceil < n ? BC_REASON_CEILING : r.lim_cap < n ? BC_REASON_CAPACITY
        : r.lim_tok < n ? BC_REASON_TOKENS : r.lim_cred < n ? BC_REASON_CREDITS : BC_REASON_NONE;
    return 0;
}

/* The pending pass's probe: row j of keys (campaign, dim, class, nmin, duration,
 * max_spend) decided at nmin = nmax = its nmin, in order; the first row that could be
 * granted, or -1 with every row's reason in out_reason; an error code in *err (rows out of
 * range: BC_E_INDEX), then the row it stopped at. */
static inline int64_t k_decide_keys(bc_eng *e, const int64_t *keys, int64_t K, int64_t t,
                                    int64_t *out_reason, int *err)
{
    int64_t j, c, d, k;
    const int64_t *row;
    bc_dec r;
    int rc;
    for (j = 0; j < K; j++) {
        row = keys + 6 * j;
        c = row[0];
        d = row[1];
        k = row[2];
        if (c < 0 || c >= e->calloc || d < 0 || d >= e->D || k < 0 || k >= e->K) {
            *err = BC_E_INDEX;
            return j;
        }
        rc = k_decide(e, c, d, k, row[3], row[3], row[4], row[5], t, 0, &r, NULL);
        if (rc) {
            *err = rc;
            return j;
        }
        if (r.n >= row[3])
            return j;
        out_reason[j] = r.reason;
    }
    return -1;
}

/* An active opportunistic lease is preempted at t: revoking, its units under notice
 * until t + grace (§6). The caller checked lid. */
static inline int k_preempt(bc_eng *e, int64_t lid, int64_t t, int64_t grace)
{
    int64_t r = lid & BC_ROW_MASK, d = e->lr[r].dim, n = e->lr[r].units;
    if (d < 0 || d >= e->D)
        return BC_E_INDEX;
    e->lr[r].state = BC_LEASE_REVOKING;
    e->lr[r].revoke_at = t + grace;
    e->rev[d] += n;
    e->oppa[d] -= n;
    return 0;
}

/* -- admission ---------------------------------------------------------------------------- */

/* One admission: decide, and commit a warm grant. BC_GRANTED / BC_REFUSED / BC_DEFERRED
 * (the policy layer decides: a reclaim, a pending request) or an error code;
 * out = [units, reason, lease id or -1, charge]. BC_E_HEAPFULL comes back before anything
 * but the (idempotent) settle changed: grow the heap and call again. */
static inline int k_admit(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t nmin,
                          int64_t nmax, int64_t dur, int64_t max_spend, int64_t t,
                          int64_t intent, int64_t *out, bc_memo *mo)
{
    bc_dec r;
    int err = k_decide(e, c, d, k, nmin, nmax, dur, max_spend, t, 0, &r, mo);
    int64_t lid, why;
    int priced;
    if (err)
        return err;
    out[0] = r.n;
    out[1] = r.reason;
    out[2] = -1;
    out[3] = 0;
    priced = e->cls[k * BC_K_NCOL + BC_K_PRICED] != 0;
    if (r.n >= nmin && r.path == BC_P_WARM) {
        err = k_room(e, d, r.n, 1, 1);
        if (err == 0 && e->scal[3] >= e->HC)
            return BC_E_HEAPFULL;
        if (priced && r.lim_cap < nmax && r.n < nmax)
            k_shortfall_m(e, d, nmax - r.n, mo);
        if (err)
            return err;
        lid = k_commit(e, c, d, k, r.n, dur, r.pm, t, 0, intent, mo);   /* checked just above */
        out[2] = lid;
        out[3] = e->lr[lid & BC_ROW_MASK].cost;
        return BC_GRANTED;
    }
    if (r.n < nmin) {
        why = k_never(e, c, d, k, nmin, dur, r.pm);
        if (why != BC_REASON_NONE) {
            out[1] = why;
            if (priced && why == BC_REASON_CAPACITY)
                k_shortfall_m(e, d, nmax, mo);
            return BC_REFUSED;
        }
    }
    return BC_DEFERRED;
}

/* A batch of admissions at one instant t (§4.4, §9): items j..m-1 of the columns, each
 * through k_admit, in order, until one needs the policy layer (BC_DEFERRED: returns its
 * index, nothing of it changed but the settle) or fails (an error code in *err: returns its
 * index). Outputs per item: units (on), reason (orz), lease id or -1 (ol). The intent id
 * of item j is intent0 + j. With rec != NULL (a journal), each item's rule inputs are
 * recorded, BC_REC_WIDTH per item: tokens, credits left, free capacity, U, the four
 * limits (capped at BC_MAXV) before, and tokens, credits left and holding after. */
static inline int64_t k_batch(bc_eng *e, const int64_t *camps, const int64_t *ks,
                              const int64_t *dims, const int64_t *nmins, const int64_t *nmaxs,
                              const int64_t *durs, int64_t t, int64_t intent0, int64_t *on,
                              int64_t *orz, int64_t *ol, int64_t j, int64_t m, int *err,
                              int64_t *rec)
{
    int64_t buf[4] = {0, 0, 0, 0}, before[8] = {0, 0, 0, 0, 0, 0, 0, 0}, c, d, k, pc, pd, pr, i;
    int64_t D = e->D, K = e->K, calloc = e->calloc;
    int rc, q;
    bc_dec x;
    bc_memo mo;
    k_memo_init(&mo);
    while (j < m) {
        c = camps[j];
        d = dims[j];
        k = ks[j];
        if ((uint64_t)c >= (uint64_t)calloc || (uint64_t)d >= (uint64_t)D
                || (uint64_t)k >= (uint64_t)K) {                /* (negatives wrap high) */
            *err = BC_E_INDEX;
            return j;
        }
        if (j + BC_PF_AHEAD < m) {    /* the campaign records of a later item, from memory now */
            pc = camps[j + BC_PF_AHEAD];
            pd = dims[j + BC_PF_AHEAD];
            if ((uint64_t)pc < (uint64_t)calloc && (uint64_t)pd < (uint64_t)D) {
                __builtin_prefetch(&e->cd[pc * D + pd].tlast);    /* the record's two lines */
                __builtin_prefetch(&e->cd[pc * D + pd].g);
                __builtin_prefetch(&e->cr[pc]);
            }
            /* the lease record a grant BC_PF_ROWS on would write, both lines, for writing */
            pr = k_row_ahead(e, BC_PF_ROWS);
            if (pr < e->L) {
                __builtin_prefetch(&e->lr[pr], 1);
                __builtin_prefetch(&e->lr[pr].t_grant, 1);
            }
        }
        if (rec != NULL) {
            rc = k_decide(e, c, d, k, nmins[j], nmaxs[j], durs[j], -1, t, 1, &x, NULL);
            if (rc < 0) {
                *err = rc;
                return j;
            }
            i = c * D + d;
            before[0] = e->cd[i].T;
            before[1] = e->cr[c].left;
            before[2] = k_free(e, d);
            before[3] = e->U[d];
            before[4] = bc_cap_maxv(x.lim_ceil);
            before[5] = bc_cap_maxv(x.lim_cap);
            before[6] = bc_cap_maxv(x.lim_tok);
            before[7] = bc_cap_maxv(x.lim_cred);
        }
        rc = k_admit(e, c, d, k, nmins[j], nmaxs[j], durs[j], -1, t, intent0 + j, buf, &mo);
        if (rc < 0) {
            *err = rc;
            return j;
        }
        if (rc == BC_DEFERRED)
            return j;
        on[j] = buf[0];
        orz[j] = buf[1];
        ol[j] = buf[2];
        if (rec != NULL) {
            i = c * D + d;
            for (q = 0; q < 8; q++)
                rec[j * BC_REC_WIDTH + q] = before[q];
            rec[j * BC_REC_WIDTH + 8] = e->cd[i].T;
            rec[j * BC_REC_WIDTH + 9] = e->cr[c].left;
            rec[j * BC_REC_WIDTH + 10] = e->cd[i].H;
        }
        j += 1;
    }
    return m;
}

/* k_batch without and with a journal: each a copy of the one loop with every call in it
 * inlined (flatten), the first with the journal's branches folded away. */
__attribute__((flatten, unused)) static int64_t k_batch_plain(
    bc_eng *e, const int64_t *camps, const int64_t *ks, const int64_t *dims,
    const int64_t *nmins, const int64_t *nmaxs, const int64_t *durs, int64_t t,
    int64_t intent0, int64_t *on, int64_t *orz, int64_t *ol, int64_t j, int64_t m, int *err)
{
    return k_batch(e, camps, ks, dims, nmins, nmaxs, durs, t, intent0, on, orz, ol, j, m, err,
                   NULL);
}

__attribute__((flatten, unused)) static int64_t k_batch_rec(
    bc_eng *e, const int64_t *camps, const int64_t *ks, const int64_t *dims,
    const int64_t *nmins, const int64_t *nmaxs, const int64_t *durs, int64_t t,
    int64_t intent0, int64_t *on, int64_t *orz, int64_t *ol, int64_t j, int64_t m, int *err,
    int64_t *rec)
{
    return k_batch(e, camps, ks, dims, nmins, nmaxs, durs, t, intent0, on, orz, ol, j, m, err,
                   rec);
}

#endif /* BURSARCORE_ENGINE_H */
