/*
 * The lease store of the admission engine (docs/spec.md §4.2, §4.3, §4.6): the expiry heap,
 * lease rows and their reuse, placement on slots, grant, activation, end with its refunds,
 * renewal and expiry. Part of engine.h (include that), which holds the state and the
 * decision these build on.
 */
#ifndef BURSARCORE_LEASES_H
#define BURSARCORE_LEASES_H

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
 * rate and the charge, write the lease, hold the units, place it unless it is starting.
 * `tree`: c is a node of a tree (§14.2: every ancestor prepays its own load's rise above its
 * rate and escrows the charge too, k_grant_up). The lease id. */
static inline int64_t k_commit_cost(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t n,
                                    int64_t dur, bc_i128 price, int64_t t, int starting,
                                    int64_t intent, int tree)
{
    int64_t i = c * e->D + d;
    const int64_t *kc = e->cls + k * BC_K_NCOL;
    int firm = kc[BC_K_PREEMPT] == 0 && (starting & BC_C_BORROWED) == 0;
    int64_t H = e->cd[i].H, s = e->cd[i].s, excess, lid, r, up[BC_TREE_DEPTH - 1];
    excess = e->scal[1] != 0 ? 0 : bc_excess(H, n, s);
    if (excess != 0)       /* (a lease within the sustained rate leaves the bucket as it is) */
        k_debit_tokens(e, i, (bc_i128)excess * dur);
    price = k_charge_at(e, c, kc, price, tree);
    if (price != 0)        /* (a free lease leaves the credit sums as they are) */
        k_escrow(e, c, price);
    if (tree > 0)          /* before the loads move */
        k_grant_up(e, c, d, n, dur, t, price, up);
    k_hold_at(e, c, d, n, firm, tree);
    if (__builtin_expect(starting & BC_C_BORROWED, 0))      /* §14.8 */
        e->bor[i * BC_BOR_NCOL + BC_BOR_HELD] += n;
    lid = k_new_lease(e, c, d, k, n, firm,
                      (starting & BC_C_STARTING) ? BC_LEASE_STARTING : BC_LEASE_ACTIVE, t, dur,
                      excess, (int64_t)price, intent);
    r = lid & BC_ROW_MASK;
    if (tree > 0)
        memcpy(e->lex + r * (BC_TREE_DEPTH - 1), up, sizeof up);
    if (starting & BC_C_STARTING) {
        e->prom[d] += n;
        e->lr[r].t_start = 0;
        e->lr[r].t_end = 0;
        e->lr[r].slot_off = -1;
    } else {
        k_place(e, lid, d, n, t);
    }
    return lid;
}

static inline int64_t k_commit_at(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t n,
                                  int64_t dur, int64_t pm, int64_t t, int starting,
                                  int64_t intent, bc_memo *mo, int tree)
{
    if (mo == NULL)
        return k_commit_cost(e, c, d, k, n, dur, bc_cost(n, dur, pm), t, starting, intent,
                             tree);
    return k_commit_cost(e, c, d, k, n, dur, k_memo_cost(mo, n, dur, pm), t, starting, intent,
                         tree);
}

static inline int64_t k_commit(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t n,
                               int64_t dur, int64_t pm, int64_t t, int starting, int64_t intent,
                               bc_memo *mo)
{
    return k_commit_at(e, c, d, k, n, dur, pm, t, starting, intent, mo,
                       e->cd[c * e->D + d].up != 0);
}

/* Grant n units of class k to (c, d) for dur at price pm (`starting`: BC_C_* flags, a
 * reclaim grant starting, a borrowed lease): the lease id, or an error code before any
 * change. */
static inline int64_t k_grant(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t n,
                              int64_t dur, int64_t pm, int64_t t, int starting, int64_t intent)
{
    int err = k_room(e, d, n, 1, !(starting & BC_C_STARTING));
    if (err)
        return err;
    if (!(starting & BC_C_STARTING) && e->scal[3] >= e->HC)
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
    int64_t n = e->lr[r].units, state = e->lr[r].state, dur, off, top, j, price;
    int firm = e->lr[r].firm != 0;
    bc_i128 remaining, back;
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
    k_refund_tokens(e, i, (bc_i128)e->lr[r].excess * remaining);
    price = e->lr[r].cost;
    if (dur == 0)
        return BC_E_ZERODIV;
    back = remaining == 0 ? 0 : bc_fdiv128((bc_i128)price * remaining, dur);
    k_credit_back(e, c, price, back);
    if (e->cd[i].up > 0)          /* §14.2: back along the path it was taken from */
        k_end_up(e, c, d, r, remaining, price, back, t);
    k_hold(e, c, d, -n, firm);
    if (!firm && e->cls[e->lr[r].lcls * BC_K_NCOL + BC_K_PREEMPT] == 0)
        e->bor[i * BC_BOR_NCOL + BC_BOR_HELD] -= n;      /* a borrowed lease (§14.8) */
    if (state == BC_LEASE_STARTING && new_state == BC_LEASE_REVOKED)
        e->lr[r].revoke_at = t;     /* revoked before it started: revoked now (§4.6) */
    e->lr[r].state = new_state;
    k_free_row(e, r);
    return 0;
}

/* Extend lease lid by ext ns at t (§4.3, §4.6), spending at most max_spend (< 0: no cap): the
 * remaining prepaid segment re-priced at every level of the campaign's path (§14.2: one level
 * for a flat campaign) as the top-most holding, on the rise of the level's load from its load
 * without the lease, and the extension charged to every budget on it. A reason code (>= 0)
 * or an error code (< 0); the price in price_out. The caller checked lid. */
static inline int k_renew(bc_eng *e, int64_t lid, int64_t ext, int64_t t, int64_t max_spend,
                          bc_i128 *price_out)
{
    int64_t r = lid & BC_ROW_MASK;
    int64_t c = e->lr[r].camp, d = e->lr[r].dim, k = e->lr[r].lcls, i;
    int64_t n = e->lr[r].units, end, K, x, old, left, lv[BC_TREE_DEPTH], ex[BC_TREE_DEPTH];
    bc_i128 new_end, delta[BC_TREE_DEPTH], pm, price;
    const int64_t *kc;
    int depth, j;
    if (c < 0 || c >= e->calloc || d < 0 || d >= e->D || k < 0 || k >= e->K)
        return BC_E_INDEX;
    kc = e->cls + k * BC_K_NCOL;
    depth = k_path_of(e, c, lv);
    end = e->lr[r].t_end;
    new_end = (bc_i128)end + ext;
    *price_out = 0;
    x = n;                       /* what the lease adds to the level's load */
    for (j = 0; j < depth; j++) {
        k_settle(e, lv[j], d, t);
        i = lv[j] * e->D + d;
        K = e->cd[i].H;
        ex[j] = e->scal[1] != 0 ? 0 : bc_excess(K - x, x, e->cd[i].s);
        old = j == 0 ? e->lr[r].excess : e->lex[r * (BC_TREE_DEPTH - 1) + j - 1];
        delta[j] = (bc_i128)ex[j] * (new_end - t) - (bc_i128)old * ((bc_i128)end - t);
        if (delta[j] > e->cd[i].T)
            return BC_REASON_TOKENS;
        x = bc_rise_through(e->cd[i].g, K - x, x);
    }
    pm = k_price(e, d, k);
    if (pm > BC_I64_MAX || pm < BC_I64_MIN)
        return BC_E_RANGE;
    left = k_path_left_at(e, c, depth > 1);
    price = bc_charge(kc[BC_K_FREEBROKE] != 0, bc_cost(n, ext, (int64_t)pm), left);
    *price_out = price;
    if (price > left)            /* (an unlimited budget, left = MAXV, bounds a cost too) */
        return BC_REASON_CREDITS;
    if (0 <= max_spend && max_spend < price)
        return BC_REASON_CREDITS;
    if (e->scal[3] >= e->HC)
        return BC_E_HEAPFULL;
    for (j = 0; j < depth; j++) {
        i = lv[j] * e->D + d;
        if (delta[j] >= 0)
            k_debit_tokens(e, i, delta[j]);
        else
            k_refund_tokens(e, i, -delta[j]);
        if (j == 0)
            e->lr[r].excess = ex[j];
        else
            e->lex[r * (BC_TREE_DEPTH - 1) + j - 1] = ex[j];
        k_escrow(e, lv[j], price);
    }
    e->lr[r].cost = bc_wadd(e->lr[r].cost, price);
    e->lr[r].dur += ext;
    e->lr[r].t_end = (int64_t)new_end;
    k_heap_push(e, (int64_t)new_end, lid);
    return BC_REASON_NONE;
}

/* Whether the heap entry (te, lid) is its lease's scheduled end: the lease is current
 * (its row not reused), active or revoking, and ends at te. Others are stale (a renewal
 * or an end moved or removed the lease's end) and are dropped when met. */
static inline int k_entry_live(const bc_eng *e, int64_t te, int64_t lid)
{
    int64_t row = lid & BC_ROW_MASK, s;
    if (lid < 0 || row >= e->L)
        return 0;
    s = e->lr[row].state;
    return e->lr[row].gen == (lid >> BC_ROW_BITS) && (s == BC_LEASE_ACTIVE || s == BC_LEASE_REVOKING)
        && e->lr[row].t_end == te;
}

/* The time of the earliest scheduled expiry, or -1: stale entries at the top of the heap
 * are dropped first (§4.4: a capacity refusal's retry_after is the next expiry). */
static inline int64_t k_next_expiry(bc_eng *e)
{
    while (e->scal[3] > 0) {
        if (k_entry_live(e, e->heap_t[0], e->heap_id[0]))
            return e->heap_t[0];
        k_heap_pop(e);
    }
    return -1;
}

/* Expire every lease due by t, up to outlen of them, in (time, id) order; their ids in
 * out. The count; an error code in *err (then the count so far). */
static inline int64_t k_advance(bc_eng *e, int64_t t, int64_t *out, int64_t outlen, int *err)
{
    int64_t m = 0, te, lid, row;
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
        if (k_entry_live(e, te, lid)) {
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

#endif /* BURSARCORE_LEASES_H */
