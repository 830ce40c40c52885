/*
 * Answers and admission of the engine (docs/spec.md §4.1, §4.2, §4.4, §7, §9): capacity
 * levels, token waits, quote cells, the pending pass's probe, preemption, one admission and
 * the batch loop, each over the decision (engine.h) and the lease store (leases.h). Part of
 * engine.h (include that).
 */
#ifndef BURSARCORE_ADMIT_H
#define BURSARCORE_ADMIT_H

/* -- answers without a change (§4.1, §4.2, §4.4, §7) ------------------------------------ */

/* Dimension d's capacity levels: free units above the warm headroom, units a reclaim
 * can reach, and the firm room. */
static inline void k_dim_figures(const bc_eng *e, int64_t d, int64_t *out)
{
    int64_t free = k_free(e, d);
    out[0] = bc_warm_opportunistic(free, e->headroom[d]);
    out[1] = bc_reachable(free, e->oppa[d], k_cover(e, d), e->prom[d]);
    out[2] = bc_firm_limit(e->cap[d], e->F[d], e->U[d], 0);
}

/* ns until (c, d)'s bucket holds the tokens n more units for dur ns need, refilling at
 * its sustained room (k_level_wait; for a node of a tree, every bucket of its path, settled
 * to c's time); -1 when it holds them now, never refills, or could never hold them. The
 * caller settled c's bucket. */
static inline bc_i128 k_token_wait(bc_eng *e, int64_t c, int64_t d, int64_t n, int64_t dur)
{
    bc_i128 w;
    if (e->cd[c * e->D + d].up != 0)      /* §14.2: every bucket on its path (settled) */
        return k_token_wait_tree(e, c, d, n, dur, e->cd[c * e->D + d].tlast);
    w = k_level_wait(e, c * e->D + d, n, dur);
    return w > 0 ? w : -1;
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
    *path = n <= r.warm ? BC_P_WARM : n <= r.lim[BC_LIMIT_CAPACITY] ? BC_P_RECLAIM : BC_P_COLD;
    *reason = bc_first_broken(r.lim, n);
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
 * but the (idempotent) settle changed: grow the heap and call again. `tree`: c is a node of
 * a tree (k_decide_at). */
enum { BC_KEEP_FIRM = 3 };   /* k_borrow_instead: no borrowed lease, the firm decision stands */

BC_WALK int k_borrow_instead(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t nmin,
                             int64_t nmax, int64_t dur, int64_t max_spend, int64_t t,
                             int64_t intent, int64_t *out, int batch, int64_t firm_n);

static inline int k_admit_at(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t nmin,
                             int64_t nmax, int64_t dur, int64_t max_spend, int64_t t,
                             int64_t intent, int64_t *out, bc_memo *mo, int tree)
{
    bc_dec r;
    int err = k_decide_at(e, c, d, k, nmin, nmax, dur, max_spend, t, 0, &r, mo, tree);
    int64_t lid, why;
    int priced;
    if (err)
        return err;
    /* §14.8: a borrower (a node of a tree: a flat campaign with a borrow limit is the root
       of a tree of its own) cut short by its firm room may borrow what gives it more */
    if (tree > 0 && r.n < nmax && k_borrower(e, c, d, k)) {
        err = k_borrow_instead(e, c, d, k, nmin, nmax, dur, max_spend, t, intent, out,
                               mo != NULL, r.n < nmin ? 0 : r.n);
        if (err != BC_KEEP_FIRM)
            return err;
    }
    out[0] = r.n;
    out[1] = r.reason;
    out[2] = -1;
    out[3] = 0;
    priced = e->cls[k * BC_K_NCOL + BC_K_PRICED] != 0;
    if (r.n >= nmin && r.path == BC_P_WARM) {
        err = k_room(e, d, r.n, 1, 1);
        if (err == 0 && e->scal[3] >= e->HC)
            return BC_E_HEAPFULL;
        if (r.n < nmax && priced && r.lim[BC_LIMIT_CAPACITY] < nmax)
            k_shortfall_m(e, d, nmax - r.n, mo);
        if (err)
            return err;
        /* (checked) a full grant's cost: k_decide_at remembered it (bc_memo) */
        if (mo != NULL && r.n == mo->cxn)
            lid = k_commit_cost(e, c, d, k, r.n, dur, mo->cx, t, 0, intent, tree);
        else
            lid = k_commit_at(e, c, d, k, r.n, dur, r.pm, t, 0, intent, mo, tree);
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

/* §14.8 a borrower's request that its firm room cut short to firm_n units (0: below its
 * minimum), decided again with the capacity rule of a
 * borrowed lease: granted borrowed (BC_GRANTED, out as k_admit_at's) when that gives at
 * least nmin units and more than firm_n; else BC_KEEP_FIRM, nothing changed but the settle
 * (the firm decision stands), or an error code. In a batch (`batch`) BC_DEFERRED before
 * anything: the single path weighs it, and its record names the path. */
BC_WALK int k_borrow_instead(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t nmin,
                             int64_t nmax, int64_t dur, int64_t max_spend, int64_t t,
                             int64_t intent, int64_t *out, int batch, int64_t firm_n)
{
    bc_dec r;
    int64_t lid;
    int err;
    if (batch)
        return BC_DEFERRED;
    err = k_decide_at(e, c, d, k, nmin, nmax, dur, max_spend, t, 1, &r, NULL, BC_BORROW);
    if (err)
        return err;
    if (r.n < nmin || r.n <= firm_n)
        return BC_KEEP_FIRM;
    err = k_room(e, d, r.n, 1, 1);
    if (err)
        return err;
    if (e->scal[3] >= e->HC)
        return BC_E_HEAPFULL;
    if (r.n < nmax && e->cls[k * BC_K_NCOL + BC_K_PRICED] != 0
            && r.lim[BC_LIMIT_CAPACITY] < nmax)
        k_shortfall(e, d, nmax - r.n);
    lid = k_commit_at(e, c, d, k, r.n, dur, r.pm, t, BC_C_BORROWED, intent, NULL,
                      e->cd[c * e->D + d].up != 0);
    out[0] = r.n;
    out[1] = r.reason;
    out[2] = lid;
    out[3] = e->lr[lid & BC_ROW_MASK].cost;
    return BC_GRANTED;
}

/* One admission (k_admit_at), a flat campaign's with the tree's figures folded away. */
static inline int k_admit(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t nmin,
                          int64_t nmax, int64_t dur, int64_t max_spend, int64_t t,
                          int64_t intent, int64_t *out, bc_memo *mo)
{
    if (__builtin_expect(e->cd[c * e->D + d].up == 0, 1))
        return k_admit_at(e, c, d, k, nmin, nmax, dur, max_spend, t, intent, out, mo, 0);
    return k_admit_at(e, c, d, k, nmin, nmax, dur, max_spend, t, intent, out, mo, 1);
}

/* The batch loop's decision and admission of a node of a tree of envelopes (§14): the
 * walks up its path, out of line, so a flat campaign's loop carries none of them. */
BC_WALK int k_decide_node(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t nmin,
                          int64_t nmax, int64_t dur, int64_t t, bc_dec *o)
{
    return k_decide_at(e, c, d, k, nmin, nmax, dur, -1, t, 1, o, NULL, 1);
}

BC_WALK int k_admit_node(bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t nmin,
                         int64_t nmax, int64_t dur, int64_t t, int64_t intent, int64_t *out,
                         bc_memo *mo)
{
    return k_admit_at(e, c, d, k, nmin, nmax, dur, -1, t, intent, out, mo, 1);
}

/* A batch of admissions at one instant t (§4.4, §9): items j..m-1 of the columns, each
 * through k_admit, in order (a node of a tree of envelopes, §14, through the walks up its
 * path), until one needs the policy layer (BC_DEFERRED: returns its index) or fails (an
 * error code in *err: returns its index). Outputs
 * per item: units (on), reason (orz), lease id or -1 (ol). The intent id of item j is
 * intent0 + j. With rec != NULL (a journal), each item's rule inputs are
 * recorded, BC_REC_WIDTH per item: tokens, credits left, free capacity, U, the rules'
 * limits in BC_LIMIT_* order (capped at BC_MAXV) before, and tokens, credits left and holding after,
 * then the level whose rule bound it and that level's figure before (§14.2, k_levels_of). */
__attribute__((always_inline)) static inline int64_t k_batch(
    bc_eng *e, const int64_t *camps, const int64_t *ks, const int64_t *dims,
    const int64_t *nmins, const int64_t *nmaxs, const int64_t *durs, int64_t t,
    int64_t intent0, int64_t *on, int64_t *orz, int64_t *ol, int64_t j, int64_t m, int *err,
    int64_t *rec)
{
    int64_t buf[4] = {0, 0, 0, 0}, nbuf[4] = {0, 0, 0, 0}, before[4 + BC_LIMITS] = {0};
    int64_t lvs[BC_LIMITS] = {0}, figs[BC_LIMITS] = {0}, rule;
    int64_t c, d, k, pc, pd, pr, i;
    int64_t D = e->D, K = e->K, calloc = e->calloc;
    int rc, q;
    bc_dec x;
    bc_memo mo, nmo;
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
            rc = k_decide_at(e, c, d, k, nmins[j], nmaxs[j], durs[j], -1, t, 1, &x, NULL,
                             BC_FLAT_ONLY);
            if (rc == BC_E_TREE)      /* a node of a tree: its path's walk, out of line */
                rc = k_decide_node(e, c, d, k, nmins[j], nmaxs[j], durs[j], t, &x);
            if (rc < 0) {
                *err = rc;
                return j;
            }
            i = c * D + d;
            before[0] = e->cd[i].T;
            before[1] = e->cr[c].left;
            before[2] = k_free(e, d);
            before[3] = e->U[d];
            for (q = 0; q < BC_LIMITS; q++)
                before[4 + q] = bc_cap_maxv(x.lim[q]);
            k_levels_of(e, c, d, k, durs[j], -1, lvs, figs);
        }
        rc = k_admit_at(e, c, d, k, nmins[j], nmaxs[j], durs[j], -1, t, intent0 + j, buf, &mo,
                        BC_FLAT_ONLY);
        if (rc == BC_E_TREE) {        /* a node of a tree: its path's walks, out of line */
            nmo = mo;                 /* (mo's address stays in the loop too) */
            rc = k_admit_node(e, c, d, k, nmins[j], nmaxs[j], durs[j], t, intent0 + j, nbuf,
                              &nmo);
            mo = nmo;
            buf[0] = nbuf[0];         /* (buf's address stays in the loop: it needs no memory) */
            buf[1] = nbuf[1];
            buf[2] = nbuf[2];
        }
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
            for (q = 0; q < 4 + BC_LIMITS; q++)
                rec[j * BC_REC_WIDTH + q] = before[q];
            rec[j * BC_REC_WIDTH + 4 + BC_LIMITS] = e->cd[i].T;
            rec[j * BC_REC_WIDTH + 5 + BC_LIMITS] = e->cr[c].left;
            rec[j * BC_REC_WIDTH + 6 + BC_LIMITS] = k_held(e, c, d);
            rule = k_binding_rule(before + 4, buf[2] >= 0, buf[0], nmaxs[j], buf[1]);
            rec[j * BC_REC_WIDTH + 7 + BC_LIMITS] = rule < 0 ? -1 : lvs[rule];
            rec[j * BC_REC_WIDTH + 8 + BC_LIMITS] = rule < 0 ? 0 : figs[rule];
        }
        j += 1;
    }
    return m;
}

/* k_batch without and with a journal: each a copy of the one loop (k_batch is always
 * inlined), the first with the journal's branches folded away. What the loop calls is
 * inlined by the compiler's own choice, not forced (`flatten`): with the rules' loops
 * unrolled, that loop runs fewer instructions per request. */
__attribute__((unused)) static int64_t k_batch_plain(
    bc_eng *e, const int64_t *camps, const int64_t *ks, const int64_t *dims,
    const int64_t *nmins, const int64_t *nmaxs, const int64_t *durs, int64_t t,
    int64_t intent0, int64_t *on, int64_t *orz, int64_t *ol, int64_t j, int64_t m, int *err)
{
    return k_batch(e, camps, ks, dims, nmins, nmaxs, durs, t, intent0, on, orz, ol, j, m, err,
                   NULL);
}

__attribute__((unused)) static int64_t k_batch_rec(
    bc_eng *e, const int64_t *camps, const int64_t *ks, const int64_t *dims,
    const int64_t *nmins, const int64_t *nmaxs, const int64_t *durs, int64_t t,
    int64_t intent0, int64_t *on, int64_t *orz, int64_t *ol, int64_t j, int64_t m, int *err,
    int64_t *rec)
{
    return k_batch(e, camps, ks, dims, nmins, nmaxs, durs, t, intent0, on, orz, ol, j, m, err,
                   rec);
}

#endif /* BURSARCORE_ADMIT_H */
