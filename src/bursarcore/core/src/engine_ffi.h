/*
 * The admission engine (engine.h) for a binding that cannot pass 128-bit integers (cffi):
 * each function calls the engine's one, with the wide results split in two 64-bit halves
 * (value = hi * 2^64 + lo, lo unsigned). Nothing here decides; every rule is engine.h's.
 * Private to the package: the engine's state layout is not part of the public ABI.
 */
#ifndef BURSARCORE_ENGINE_FFI_H
#define BURSARCORE_ENGINE_FFI_H

#include "engine.h"

/* --- cdef begin (the declarations the cffi binding reads) */
typedef struct {
    int64_t hi;
    uint64_t lo;
} bce_wide;
/* --- cdef end */

static inline bce_wide bce_wide_of(bc_i128 v)
{
    bce_wide w;
    w.hi = (int64_t)(v >> 64);
    w.lo = (uint64_t)v;
    return w;
}

/* --- cdef begin */
static void bce_settle(bc_eng *e, int64_t c, int64_t d, int64_t t);
static int64_t bce_unmet(bc_eng *e, int64_t c, int64_t d);
static int64_t bce_path_slack(bc_eng *e, int64_t c, int64_t d);
static int64_t bce_child_room(bc_eng *e, int64_t p, int64_t d);
static int64_t bce_child_load_room(bc_eng *e, int64_t p, int64_t d);
static void bce_link(bc_eng *e, int64_t c, int64_t p, int64_t t);
static void bce_make_root(bc_eng *e, int64_t c);
static void bce_enlist(bc_eng *e, int64_t c, int64_t p);
static void bce_change_node(bc_eng *e, int64_t c, const int64_t *g, const int64_t *s,
                            const int64_t *b, const int64_t *Bcap, int64_t budget, int64_t t);
static int64_t bce_free(bc_eng *e, int64_t d);
static void bce_ring_advance(bc_eng *e, int64_t t);
static bce_wide bce_cong_ppm(bc_eng *e, int64_t d);
static int64_t bce_cong_mult(bc_eng *e, int64_t d);
static bce_wide bce_price(bc_eng *e, int64_t d, int64_t k);
static bce_wide bce_cost(int64_t n, int64_t dur, int64_t pm);
static int bce_decide(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t nmin, int64_t nmax,
                      int64_t dur, int64_t max_spend, int64_t t, int64_t *out);
static int bce_decide_levels(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t nmin,
                             int64_t nmax, int64_t dur, int64_t max_spend, int64_t t,
                             int64_t *out);
static int64_t bce_decide_keys(bc_eng *e, const int64_t *keys, int64_t K, int64_t t,
                               int64_t *out_reason, int *err);
static int64_t bce_never(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t nmin,
                         int64_t dur, int64_t pm);
static void bce_dim_figures(bc_eng *e, int64_t d, int64_t *out);
static bce_wide bce_token_wait(bc_eng *e, int64_t c, int64_t d, int64_t n, int64_t dur);
static int bce_quote(bc_eng *e, int64_t c, int64_t d, int64_t k, const int64_t *sizes,
                     int64_t na, const int64_t *durs, int64_t nb, int64_t t, double *cost,
                     int64_t *path, int64_t *reason, int64_t *wide_at, bce_wide *wide);
static int64_t bce_grant(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t n, int64_t dur,
                         int64_t pm, int64_t t, int starting, int64_t intent);
static int bce_activate(bc_eng *e, int64_t lid, int64_t t);
static int bce_preempt(bc_eng *e, int64_t lid, int64_t t, int64_t grace);
static int bce_end_lease(bc_eng *e, int64_t lid, int64_t t, int64_t new_state);
static int bce_renew(bc_eng *e, int64_t lid, int64_t ext, int64_t t, int64_t max_spend,
                     bce_wide *price);
static void bce_heap_push(bc_eng *e, int64_t t, int64_t lid);
static void bce_heap_pop(bc_eng *e);
static int64_t bce_next_expiry(bc_eng *e);
static int64_t bce_advance(bc_eng *e, int64_t t, int64_t *out, int64_t outlen, int *err);
static int bce_admit(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t nmin, int64_t nmax,
                     int64_t dur, int64_t max_spend, int64_t t, int64_t intent, int64_t *out);
static int64_t bce_batch(bc_eng *e, const int64_t *camps, const int64_t *ks, const int64_t *dims,
                         const int64_t *nmins, const int64_t *nmaxs, const int64_t *durs,
                         int64_t t, int64_t intent0, int64_t *on, int64_t *orz, int64_t *ol,
                         int64_t j, int64_t m, int *err, int64_t *rec);
static int64_t bce_row(bc_eng *e, int64_t lid);
/* --- cdef end */

static void bce_settle(bc_eng *e, int64_t c, int64_t d, int64_t t) { k_settle(e, c, d, t); }
static int64_t bce_unmet(bc_eng *e, int64_t c, int64_t d) { return k_unmet(e, c, d); }
static int64_t bce_path_slack(bc_eng *e, int64_t c, int64_t d) { return k_path_slack(e, c, d); }
static int64_t bce_child_room(bc_eng *e, int64_t p, int64_t d) { return k_child_room(e, p, d); }
static int64_t bce_child_load_room(bc_eng *e, int64_t p, int64_t d)
{
    return k_child_load_room(e, p, d);
}
static void bce_change_node(bc_eng *e, int64_t c, const int64_t *g, const int64_t *s,
                            const int64_t *b, const int64_t *Bcap, int64_t budget, int64_t t)
{
    k_change_node(e, c, g, s, b, Bcap, budget, t);
}
static void bce_link(bc_eng *e, int64_t c, int64_t p, int64_t t) { k_link(e, c, p, t); }
static void bce_make_root(bc_eng *e, int64_t c) { k_make_root(e, c); }
static void bce_enlist(bc_eng *e, int64_t c, int64_t p) { k_enlist(e, c, p); }
static int64_t bce_free(bc_eng *e, int64_t d) { return k_free(e, d); }
static void bce_ring_advance(bc_eng *e, int64_t t) { k_ring_advance(e, t); }
static bce_wide bce_cong_ppm(bc_eng *e, int64_t d) { return bce_wide_of(k_cong_ppm(e, d)); }
static int64_t bce_cong_mult(bc_eng *e, int64_t d) { return k_cong_mult(e, d); }
static bce_wide bce_price(bc_eng *e, int64_t d, int64_t k) { return bce_wide_of(k_price(e, d, k)); }
static bce_wide bce_cost(int64_t n, int64_t dur, int64_t pm) { return bce_wide_of(bc_cost(n, dur, pm)); }

/* out = [n, reason, path, pm, the rules' limits in BC_LIMIT_* order] */
static int bce_decide(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t nmin, int64_t nmax,
                      int64_t dur, int64_t max_spend, int64_t t, int64_t *out)
{
    bc_dec r;
    int i, err = k_decide(e, c, d, k, nmin, nmax, dur, max_spend, t, 1, &r, NULL);
    if (err)
        return err;
    out[0] = r.n;
    out[1] = r.reason;
    out[2] = r.path;
    out[3] = r.pm;
    for (i = 0; i < BC_LIMITS; i++)
        out[4 + i] = r.lim[i];
    return 0;
}

/* out = [the rules' limits, the node whose limit each is (-1: none), that node's figure],
 * each in BC_LIMIT_* order (§14.2, k_levels_of) */
static int bce_decide_levels(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t nmin,
                             int64_t nmax, int64_t dur, int64_t max_spend, int64_t t,
                             int64_t *out)
{
    bc_dec r;
    int i, err = k_decide(e, c, d, k, nmin, nmax, dur, max_spend, t, 1, &r, NULL);
    if (err)
        return err;
    for (i = 0; i < BC_LIMITS; i++)
        out[i] = r.lim[i];
    k_levels_of(e, c, d, k, dur, max_spend, out + BC_LIMITS, out + 2 * BC_LIMITS);
    return 0;
}

static int64_t bce_decide_keys(bc_eng *e, const int64_t *keys, int64_t K, int64_t t,
                               int64_t *out_reason, int *err)
{
    return k_decide_keys(e, keys, K, t, out_reason, err);
}

static int64_t bce_never(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t nmin,
                         int64_t dur, int64_t pm)
{
    return k_never(e, c, d, k, nmin, dur, pm);
}

static void bce_dim_figures(bc_eng *e, int64_t d, int64_t *out) { k_dim_figures(e, d, out); }

static bce_wide bce_token_wait(bc_eng *e, int64_t c, int64_t d, int64_t n, int64_t dur)
{
    return bce_wide_of(k_token_wait(e, c, d, n, dur));
}

/* A quote's cells, row-major; a charge beyond 2^53 in magnitude (not exact as a double) is
 * also given whole: the first such cell's index in *wide_at and its value in *wide (the
 * caller asks again from the cell after it). */
static int bce_quote(bc_eng *e, int64_t c, int64_t d, int64_t k, const int64_t *sizes,
                     int64_t na, const int64_t *durs, int64_t nb, int64_t t, double *cost,
                     int64_t *path, int64_t *reason, int64_t *wide_at, bce_wide *wide)
{
    int64_t a, b, from = *wide_at;
    bc_i128 price;
    int err;
    *wide_at = -1;
    for (a = 0; a < na; a++) {
        for (b = 0; b < nb; b++) {
            if (a * nb + b < from)
                continue;
            err = k_quote_cell(e, c, d, k, sizes[a], durs[b], t, &price, &path[a * nb + b],
                               &reason[a * nb + b]);
            if (err)
                return err;
            cost[a * nb + b] = (double)price;
            if (price > ((bc_i128)1 << 53) || price < -((bc_i128)1 << 53)) {
                *wide_at = a * nb + b;
                *wide = bce_wide_of(price);
                return 0;
            }
        }
    }
    return 0;
}

static int64_t bce_grant(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t n, int64_t dur,
                         int64_t pm, int64_t t, int starting, int64_t intent)
{
    return k_grant(e, c, d, k, n, dur, pm, t, starting, intent);
}

static int bce_activate(bc_eng *e, int64_t lid, int64_t t) { return k_activate(e, lid, t); }
static int bce_preempt(bc_eng *e, int64_t lid, int64_t t, int64_t grace)
{
    return k_preempt(e, lid, t, grace);
}
static int bce_end_lease(bc_eng *e, int64_t lid, int64_t t, int64_t new_state)
{
    return k_end_lease(e, lid, t, new_state);
}

static int bce_renew(bc_eng *e, int64_t lid, int64_t ext, int64_t t, int64_t max_spend,
                     bce_wide *price)
{
    bc_i128 p = 0;
    int r = k_renew(e, lid, ext, t, max_spend, &p);
    *price = bce_wide_of(p);
    return r;
}

static void bce_heap_push(bc_eng *e, int64_t t, int64_t lid) { k_heap_push(e, t, lid); }
static void bce_heap_pop(bc_eng *e) { k_heap_pop(e); }
static int64_t bce_next_expiry(bc_eng *e) { return k_next_expiry(e); }

static int64_t bce_advance(bc_eng *e, int64_t t, int64_t *out, int64_t outlen, int *err)
{
    return k_advance(e, t, out, outlen, err);
}

static int bce_admit(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t nmin, int64_t nmax,
                     int64_t dur, int64_t max_spend, int64_t t, int64_t intent, int64_t *out)
{
    return k_admit(e, c, d, k, nmin, nmax, dur, max_spend, t, intent, out, NULL);
}

static int64_t bce_batch(bc_eng *e, const int64_t *camps, const int64_t *ks, const int64_t *dims,
                         const int64_t *nmins, const int64_t *nmaxs, const int64_t *durs,
                         int64_t t, int64_t intent0, int64_t *on, int64_t *orz, int64_t *ol,
                         int64_t j, int64_t m, int *err, int64_t *rec)
{
    if (rec == NULL)
        return k_batch_plain(e, camps, ks, dims, nmins, nmaxs, durs, t, intent0, on, orz, ol,
                             j, m, err);
    return k_batch_rec(e, camps, ks, dims, nmins, nmaxs, durs, t, intent0, on, orz, ol, j, m,
                       err, rec);
}

static int64_t bce_row(bc_eng *e, int64_t lid) { return k_row(e, lid); }

#endif /* BURSARCORE_ENGINE_FFI_H */
