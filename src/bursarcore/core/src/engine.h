/*
 * The admission engine (docs/spec.md §4–§7): tokens and holdings, congestion and price,
 * the decision, the lease store (grant, activation, end, renewal, expiry) and the batch
 * loop, over one state. Every rule is one inline function of this header or of the two it
 * includes at its end (leases.h: the lease store; admit.h: answers, admission and the
 * batch), and every path — a single decision, a batch, a grant, a renewal, a quote, a
 * "never" check — calls the same one; the arithmetic on one campaign's numbers comes from
 * rules.h.
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
#include <string.h>

#include "bursarcore.h"
#include "ints.h"

/* --- cdef begin (the codes, records and state as a binding declares them) */
/* class-table columns */
enum { BC_K_RANK, BC_K_MULT, BC_K_PRICED, BC_K_PREEMPT, BC_K_GRACE, BC_K_FREEBROKE, BC_K_NCOL };

/* reason codes, outcomes and lease states: the public header's (bursarcore.h) */

/* grant paths (BC_P_BORROW: warm, on units borrowed from siblings' idle guarantees, §14.8) */
enum { BC_P_WARM, BC_P_RECLAIM, BC_P_COLD, BC_P_BORROW };

/* borrowing columns per (campaign, dimension) (§14.8): the borrow limit, the lend limit
 * (BC_MAXV: none), the units its borrowed leases hold, and a node of a tree's descendants'
 * firm holding */
enum { BC_BOR_LIMIT, BC_BOR_LEND, BC_BOR_HELD, BC_BOR_FSUB, BC_BOR_NCOL };

/* sibling-list columns, one row per campaign v at row v + 1 and the pool's at row 0 (§14.8):
 * its first child's index + 1 (0: none; the pool's children are the top-level nodes), and
 * its next sibling's index + 1 (-1: the last of its list; 0: in no list) */
enum { BC_SIB_CHILD, BC_SIB_NEXT, BC_SIB_NCOL };

/* k_decide_at's `tree` beyond 0 and 1: the capacity rule of a borrowed lease (§14.8) */
enum { BC_BORROW = 2 };

/* k_commit_cost's `starting` flags */
enum { BC_C_STARTING = 1, BC_C_BORROWED = 2 };

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
    BC_E_ENDED = -10,    /* ending a lease that has already ended */
    BC_E_TREE = -11      /* a node of a tree asked of the flat path (k_batch walks its path) */
};

enum {
    BC_ROW_BITS = 32,  /* lease id = row | generation << BC_ROW_BITS */
    BC_REC_WIDTH = 9 + BC_LIMITS, /* journal inputs per batch item (k_batch's rec) */
    BC_PF_AHEAD = 6,   /* the batch loop reads the campaign records this far ahead */
    BC_PF_ROWS = 12    /* ... and the lease record this many grants ahead */
};
/* --- cdef end */

#define BC_ROW_MASK ((int64_t)0xFFFFFFFFLL)
#define BC_GEN_MASK ((int64_t)0x3FFFFFFFLL)
#define BC_FS_REBASE 256.0     /* |t - E| in half-lives beyond which the epoch E moves */

#include "rules.h"

/* --- cdef begin */

/* A (campaign, dimension) record, 128 bytes, the fields a grant touches in the first
 * line: last settlement, holding, tokens, sustained rate, burst ceiling, bucket size,
 * ∫H dt, guarantee, firm holding, and token counters; then the campaign's place in the tree
 * of envelopes (§14): up (its parent's index + 1; BC_UP_ROOT for a top-level node with
 * children; 0 for a flat campaign), Σ over its children of their commitments R (Rch) and of
 * what they add to its load (Xch). H is the load K its ceiling and bucket bind (§14.2: its
 * own leases' units and, Xch, Σ over its children of max(g_ch, K_ch); for a flat campaign its
 * holding), Hf its own leases' firm units. */
typedef struct {
    int64_t tlast, H, T, s, b, Bcap, acc, tok_debited;
    int64_t g, Hf, tok_minted, tok_refunded, tok_clipped, up, Rch, Xch;
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
    int64_t *cap, *headroom, *occ, *prom, *rev, *resv, *F, *U, *oppa, *pend, *price, *gsum;
    int64_t *cls, *cong_thr, *cong_mult, *ring, *ring_sum, *scal;
    int32_t *free_slots;
    int64_t *top;
    /* campaigns: one record per (campaign, dimension), one per campaign */
    bc_cdrow *cd;
    bc_crow *cr;
    int64_t *gch;              /* per (campaign, dimension): Σ of its children's guarantees */
    int64_t *Hsub;             /* ... and a node of a tree's subtree holding (§14.2) */
    int64_t *bor;              /* ... and its borrowing columns, BC_BOR_NCOL (§14.8) */
    int64_t *sib;              /* per campaign + 1 (row 0: the pool): BC_SIB_NCOL */
    int64_t *fs_par;           /* [half-life ns, epoch ns] */
    long long fs_t;            /* cache: the last time fs_weight computed, and its weight */
    double fs_w;
    int fs_ok;
    /* leases: one record per row */
    bc_lrow *lr;
    int64_t *lex;              /* per row, BC_TREE_DEPTH - 1: the excess each ancestor prepaid
                                  (NULL while no tree of envelopes exists) */
    int64_t *freeq;            /* ring of ended rows (length L) */
    int64_t *lfree;            /* [head, tail, reuse_after] */
    int32_t *arena;
    int64_t *arena_top;
    int64_t *heap_t, *heap_id;
} bc_eng;

/* --- cdef end */

/* What a batch remembers between its items: the last price while nothing in the batch can
 * move it (an unpriced class, no congestion table, or no priced demand), and the last
 * cost. d < 0: no price remembered; cn < 0: no cost. */
typedef struct {
    int64_t d, k, pm;
    int64_t cn, cdur, cpm, cxn, cx;
    bc_i128 ccost;
} bc_memo;

static inline void k_memo_init(bc_memo *mo)
{
    mo->d = mo->k = mo->pm = -1;
    mo->cn = mo->cdur = mo->cpm = mo->cxn = -1;
    mo->cx = 0;
    mo->ccost = 0;
}

/* bc_cost(n, dur, pm), remembered for the next grant of the same size, duration and price;
 * when that cost is exact (bc_cost_exact) and fits int64, mo->cxn is n and mo->cx the cost,
 * else cxn is -1. */
static inline bc_i128 k_memo_cost(bc_memo *mo, int64_t n, int64_t dur, int64_t pm)
{
    bc_i128 x;
    if (n != mo->cn || dur != mo->cdur || pm != mo->cpm) {
        x = bc_cost(n, dur, pm);
        mo->cn = n;
        mo->cdur = dur;
        mo->cpm = pm;
        mo->ccost = x;
        mo->cxn = bc_cost_exact(n, dur, pm) && BC_I64_MIN <= x && x <= BC_I64_MAX ? n : -1;
        mo->cx = (int64_t)x;
    }
    return mo->ccost;
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
    dt = (bc_i128)((uint64_t)t - (uint64_t)tl);    /* (t > tl: below 2**64) */
    e->cd[i].tlast = t;
    H = e->cd[i].H;
    /* the low 64 bits of H * dt: the wrapping 64-bit product */
    e->cd[i].acc = (int64_t)((uint64_t)e->cd[i].acc + (uint64_t)H * ((uint64_t)t - (uint64_t)tl));
    rate = bc_refill_rate(H, e->cd[i].s);
    T = e->cd[i].T;
    if (rate > 0) {
        if (e->cd[i].Bcap == T)     /* a full bucket (or an unlimited one): nothing to add */
            return;
        room = (bc_i128)e->cd[i].Bcap - T;
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

/* (c, d)'s unmet guarantee: its slack (§14.3; g less its firm holding, for a node without
 * children). */
static inline int64_t k_unmet(const bc_eng *e, int64_t c, int64_t d)
{
    int64_t i = c * e->D + d;
    return bc_slack(e->cd[i].g, e->cd[i].Hf, e->cd[i].Rch);
}

static inline int64_t k_free(const bc_eng *e, int64_t d)
{
    return bc_free(e->cap[d], e->occ[d], e->prom[d], e->rev[d], e->resv[d]);
}

/* §4.1, §4.6 d's units under notice plus its reserve: what bc_reachable takes as `rev`, so
 * that less the promises it is what the units under notice bring beyond every promise. */
static inline int64_t k_cover(const bc_eng *e, int64_t d)
{
    return e->rev[d] + bc_reserve(e->prom[d], e->rev[d], e->resv[d]);
}

/* -- what a lease takes from and gives back to one level (§4.2, §4.3) -------------------- */

/* (c, d)'s bucket (record i) pays `debit` unit·ns for a grant or a renewal. */
static inline void k_debit_tokens(bc_eng *e, int64_t i, bc_i128 debit)
{
    e->cd[i].T = bc_wadd(e->cd[i].T, -debit);
    e->cd[i].tok_debited = bc_wadd(e->cd[i].tok_debited, debit);
}

/* (c, d)'s bucket (record i) takes `refund` unit·ns back, up to its size; the rest is
 * clipped. */
static inline void k_refund_tokens(bc_eng *e, int64_t i, bc_i128 refund)
{
    int64_t T = e->cd[i].T;
    bc_i128 room = (bc_i128)e->cd[i].Bcap - T, got = refund < room ? refund : room;
    e->cd[i].T = bc_wadd(T, got);
    e->cd[i].tok_refunded = bc_wadd(e->cd[i].tok_refunded, got);
    e->cd[i].tok_clipped = bc_wadd(e->cd[i].tok_clipped, refund > room ? refund - room : 0);
}

/* Campaign c's budget escrows a charge (a budget of BC_MAXV, none, is not drawn down). */
static inline void k_escrow(bc_eng *e, int64_t c, bc_i128 charge)
{
    if (e->cr[c].left < BC_MAXV)
        e->cr[c].left = bc_wadd(e->cr[c].left, -charge);
    e->cr[c].escrow = bc_wadd(e->cr[c].escrow, charge);
    e->cr[c].cred_debited = bc_wadd(e->cr[c].cred_debited, charge);
}

/* Campaign c's escrow of a lease charged `price` ends: `back` returns to its budget, the
 * rest is spent. */
static inline void k_credit_back(bc_eng *e, int64_t c, int64_t price, bc_i128 back)
{
    if (e->cr[c].left < BC_MAXV)
        e->cr[c].left = bc_wadd(e->cr[c].left, back);
    e->cr[c].escrow = bc_wadd(e->cr[c].escrow, -(bc_i128)price);
    e->cr[c].refunded = bc_wadd(e->cr[c].refunded, back);
    e->cr[c].spent = bc_wadd(e->cr[c].spent, (bc_i128)price - back);
}

#include "tree.h"


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

/* Change (c, d)'s own holding by delta (firm: also its firm holding, F and U = Σ_top R − F),
 * folding its own holding so far into c's fair-share usage (the caller settled: tlast is
 * now); tree > 0: c is a node of a tree (§14), and its ancestors' holdings and commitments
 * follow (0 or BC_FLAT_ONLY: a flat campaign). */
static inline void k_hold_at(bc_eng *e, int64_t c, int64_t d, int64_t delta, int firm, int tree)
{
    int64_t i = c * e->D + d, h = e->cd[i].H, g = e->cd[i].g, hf, rch, dr;
    double w;
    if (d == 0) {
        w = (e->fs_ok && e->fs_t == e->cd[i].tlast) ? e->fs_w : k_fs_weight(e, e->cd[i].tlast);
        e->cr[c].fsS = e->cr[c].fsS
            + (double)(tree > 0 ? h - e->cd[i].Xch : h) * (w - e->cr[c].fsG);
        e->cr[c].fsG = w;
    }
    e->cd[i].H = h + delta;
    if (tree > 0) {
        e->Hsub[i] += delta;
        k_measure_up(e, e->cd[i].up, d, delta, bc_rise_through(g, h, delta),
                     firm ? delta : 0, e->cd[i].tlast);
    }
    if (firm) {
        hf = e->cd[i].Hf;
        rch = tree > 0 ? e->cd[i].Rch : 0;
        e->cd[i].Hf = hf + delta;
        e->F[d] += delta;
        if (tree > 0) {
            dr = bc_commitment(g, hf + delta, rch) - bc_commitment(g, hf, rch);
            e->U[d] += k_commit_up(e, e->cd[i].up, d, dr) - delta;
        } else {        /* R − Hf of a node without children is its slack, g − Hf above 0 */
            e->U[d] += bc_slack(g, hf + delta, 0) - bc_slack(g, hf, 0);
        }
    }
}

BC_WALK void k_hold_tree(bc_eng *e, int64_t c, int64_t d, int64_t delta, int firm)
{
    k_hold_at(e, c, d, delta, firm, 1);
}

static inline void k_hold(bc_eng *e, int64_t c, int64_t d, int64_t delta, int firm)
{
    if (__builtin_expect(e->cd[c * e->D + d].up == 0, 1))
        k_hold_at(e, c, d, delta, firm, 0);
    else
        k_hold_tree(e, c, d, delta, firm);
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

/* The charge of a lease of class row kc priced `price` to campaign c (§7; a class that runs
 * free when broke runs free when a budget on c's path cannot pay, §14.2). tree: c is a node
 * of a tree. */
static inline bc_i128 k_charge_at(const bc_eng *e, int64_t c, const int64_t *kc, bc_i128 price,
                                  int tree)
{
    return bc_charge(kc[BC_K_FREEBROKE] != 0, price, k_path_left_at(e, c, tree));
}

static inline bc_i128 k_charge(const bc_eng *e, int64_t c, const int64_t *kc, bc_i128 price)
{
    return k_charge_at(e, c, kc, price, e->cd[c * e->D].up != 0);
}

/* -- the decision (§4.4) ------------------------------------------------------------------ */

/* What the rules read for a request of class k on (c, d) for dur ns at price pm, spending
 * at most max_spend (bc_req); for a node of a tree (`tree`) its own figures, which a decision
 * completes with its path's (k_path_read: the ancestors' slack, the least budget). */
static inline void k_request(const bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t dur,
                             int64_t max_spend, int64_t pm, int64_t free, bc_req *q, int tree)
{
    int64_t i = c * e->D + d;
    const int64_t *kc = e->cls + k * BC_K_NCOL;
    q->H = e->cd[i].H;
    q->s = e->cd[i].s;
    q->b = e->cd[i].b;
    q->T = e->cd[i].T;
    q->Bcap = e->cd[i].Bcap;
    q->g = e->cd[i].g;
    q->unmet = bc_slack(q->g, e->cd[i].Hf, tree > 0 ? e->cd[i].Rch : 0);
    q->left = e->cr[c].left;
    q->escrow = e->cr[c].escrow;
    q->cap = e->cap[d];
    q->F = e->F[d];
    q->U = e->U[d];
    q->gsum = e->gsum[d];
    q->free = free;
    q->oppa = e->oppa[d];
    q->rev = k_cover(e, d);
    q->prom = e->prom[d];
    q->headroom = e->headroom[d];
    q->pm = pm;
    q->dur = dur;
    q->max_spend = max_spend;
    q->firm = kc[BC_K_PREEMPT] == 0;
    q->free_when_broke = kc[BC_K_FREEBROKE] != 0;
    q->instant = e->scal[1] != 0;
    q->cn = -1;
    q->ccost = 0;
}

/* Decide a request of [nmin, nmax] units of class k on (c, d) for dur ns at t, spending at
 * most max_spend micro-credits (< 0: no cap): its bucket settled, its price, then the rules'
 * sizing (bc_size; with `exact` false the limits that take a division are divided out only
 * when they may bind) and its path. `tree`: 1 when c is a node of a tree (its up != 0); 0 for
 * a flat campaign, the tree's figures folded away; BC_FLAT_ONLY the same, but a node of a
 * tree is not decided (BC_E_TREE, nothing changed but the settle), and BC_BORROW decides a
 * borrowed lease (§14.8). Returns 0 or an error code. */
static inline int k_decide_at(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t nmin,
                              int64_t nmax, int64_t dur, int64_t max_spend, int64_t t,
                              int exact, bc_dec *o, bc_memo *mo, int tree)
{
    const int64_t *kc = e->cls + k * BC_K_NCOL;
    int64_t free, xlim[BC_LIMITS], pm, cn = -1, ccost = 0;
    bc_i128 p;
    bc_req q;
    int err;
    k_settle(e, c, d, t);
    if (tree == BC_FLAT_ONLY && __builtin_expect(e->cd[c * e->D + d].up != 0, 0))
        return BC_E_TREE;
    free = k_free(e, d);
    if (mo != NULL && mo->d == d && mo->k == k) {
        pm = mo->pm;
    } else {
        p = k_price_f(e, d, k, free);
        if (p > BC_I64_MAX || p < BC_I64_MIN)
            return BC_E_RANGE;
        pm = (int64_t)p;
        if (mo != NULL && k_price_fixed(e, d, kc)) {
            mo->d = d;
            mo->k = k;
            mo->pm = pm;
        }
    }
    o->pm = pm;
    if (mo != NULL) {           /* the cost of nmax, which a full grant commits (k_admit_at) */
        k_memo_cost(mo, nmax, dur, pm);
        cn = mo->cxn;
        ccost = mo->cx;
    }
    k_request(e, c, d, k, dur, max_spend, pm, free, &q, tree);
    q.cn = cn;
    q.ccost = ccost;
    if (tree > 0) {     /* §14.2: every level of the path binds; §14.3 its slack is c's room */
        q.unmet += k_path_read(e, c, d, dur, t, xlim, &q.left);
        if (tree == BC_BORROW) {  /* §14.8: free units within the firm room and the borrow room */
            q.firm = 2;
            q.unmet = bc_cap_maxv((bc_i128)q.unmet + k_borrow_room(e, c, d));
            q.free = bc_min64(q.free, k_borrow_left(e, c, d));
        }
        err = bc_size(&q, nmin, nmax, exact, xlim, o);
    } else {
        err = bc_size(&q, nmin, nmax, exact, NULL, o);
    }
    if (err)
        return err;
    o->path = o->n <= o->warm ? BC_P_WARM : BC_P_RECLAIM;
    return 0;
}

static inline int k_decide(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t nmin,
                           int64_t nmax, int64_t dur, int64_t max_spend, int64_t t,
                           int exact, bc_dec *o, bc_memo *mo)
{
    return k_decide_at(e, c, d, k, nmin, nmax, dur, max_spend, t, exact, o, mo,
                       e->cd[c * e->D + d].up != 0);
}

/* Whether a request of nmin units could never be granted, whatever the others do (bc_never).
 * The reason, or BC_REASON_NONE. */
static inline int64_t k_never(const bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t nmin,
                              int64_t dur, int64_t pm)
{
    int tree = e->cd[c * e->D + d].up != 0;
    bc_req q;
    k_request(e, c, d, k, dur, -1, pm, k_free(e, d), &q, tree);
    if (tree) {
        q.g = k_path_free_g(e, c, d);               /* §14.3: g, for a flat campaign */
        return k_never_tree(e, c, d, nmin, &q);
    }
    return bc_never(&q, nmin);
}

#include "leases.h"
#include "admit.h"

#endif /* BURSARCORE_ENGINE_H */
