/*
 * The admission engine of the C ABI (bursarcore.h): a bc_eng (engine.h) that owns its
 * arrays and grows them, around the kernels every binding shares. Growth allocates the new
 * arrays first and swaps them in only when every allocation succeeded, so a failed growth
 * changes nothing (BC_ENOMEM).
 */
#include <stdlib.h>
#include <string.h>

#include "bursarcore.h"
#include "engine.h"

struct bc_engine {
    bc_eng e;
    int64_t C;           /* campaigns registered */
};

static void *engine_zalloc(size_t n, size_t size)
{
    void *p;
    if (n == 0)
        n = 1;
    if (n > SIZE_MAX / size)
        return NULL;
    p = aligned_alloc(64, ((n * size + 63) / 64) * 64);
    if (p != NULL)
        memset(p, 0, ((n * size + 63) / 64) * 64);
    return p;
}

static int64_t *engine_dup64(const int64_t *src, size_t n)
{
    int64_t *p = engine_zalloc(n, sizeof(int64_t));
    if (p != NULL && src != NULL && n > 0)
        memcpy(p, src, n * sizeof(int64_t));
    return p;
}

void bc_engine_free(bc_engine *x)
{
    bc_eng *e;
    if (x == NULL)
        return;
    e = &x->e;
    free(e->cap); free(e->headroom); free(e->occ); free(e->prom); free(e->rev);
    free(e->resv);
    free(e->F); free(e->U); free(e->oppa); free(e->pend); free(e->price); free(e->gsum);
    free(e->cls); free(e->cong_thr); free(e->cong_mult); free(e->ring); free(e->ring_sum);
    free(e->scal); free(e->free_slots); free(e->top); free(e->cd); free(e->cr);
    free(e->gch); free(e->Hsub); free(e->bor); free(e->sib); free(e->fs_par); free(e->lr);
    free(e->lex); free(e->freeq); free(e->lfree); free(e->arena);
    free(e->arena_top); free(e->heap_t); free(e->heap_id);
    free(x);
}

/* Room for L lease rows (the expiry heap for L + 1 entries). */
static int engine_grow_leases(bc_eng *e, int64_t L)
{
    bc_lrow *lr;
    int64_t *lex, *freeq, *ht, *hi, head = e->lfree[0], tail = e->lfree[1], j;
    int64_t hc = e->HC > L + 1 ? e->HC : L + 1;
    if (L <= e->L)
        return BC_OK;
    if (L > ((int64_t)1 << BC_ROW_BITS))
        return BC_ERANGE;
    lr = engine_zalloc((size_t)L, sizeof(bc_lrow));
    lex = e->lex == NULL ? NULL    /* (kept once a tree of envelopes exists) */
          : engine_zalloc((size_t)L * (BC_TREE_DEPTH - 1), sizeof(int64_t));
    freeq = engine_zalloc((size_t)L, sizeof(int64_t));
    ht = engine_zalloc((size_t)hc, sizeof(int64_t));
    hi = engine_zalloc((size_t)hc, sizeof(int64_t));
    if (lr == NULL || (lex == NULL && e->lex != NULL) || freeq == NULL || ht == NULL
            || hi == NULL) {
        free(lr); free(lex); free(freeq); free(ht); free(hi);
        return BC_ENOMEM;
    }
    if (e->L > 0) {
        memcpy(lr, e->lr, (size_t)e->L * sizeof(bc_lrow));
        if (lex != NULL)
            memcpy(lex, e->lex, (size_t)e->L * (BC_TREE_DEPTH - 1) * sizeof(int64_t));
    }
    for (j = head; j < tail; j++)       /* the FIFO of ended rows, laid out afresh */
        freeq[j - head] = e->freeq[j % e->L];
    if (e->HC > 0) {
        memcpy(ht, e->heap_t, (size_t)e->HC * sizeof(int64_t));
        memcpy(hi, e->heap_id, (size_t)e->HC * sizeof(int64_t));
    }
    free(e->lr); free(e->lex); free(e->freeq); free(e->heap_t); free(e->heap_id);
    e->lr = lr;
    e->lex = lex;
    e->freeq = freeq;
    e->heap_t = ht;
    e->heap_id = hi;
    e->L = L;
    e->HC = hc;
    e->lfree[0] = 0;
    e->lfree[1] = tail - head;
    return BC_OK;
}

static int engine_grow_heap(bc_eng *e)
{
    int64_t hc = 2 * e->HC + 16;
    int64_t *ht = engine_zalloc((size_t)hc, sizeof(int64_t)), *hi = engine_zalloc((size_t)hc, sizeof(int64_t));
    if (ht == NULL || hi == NULL) {
        free(ht); free(hi);
        return BC_ENOMEM;
    }
    memcpy(ht, e->heap_t, (size_t)e->HC * sizeof(int64_t));
    memcpy(hi, e->heap_id, (size_t)e->HC * sizeof(int64_t));
    free(e->heap_t); free(e->heap_id);
    e->heap_t = ht;
    e->heap_id = hi;
    e->HC = hc;
    return BC_OK;
}

/* Room for `need` more slot ids in the arena: the live leases' ranges packed to the front
 * of a new arena, as large as that needs. */
static int engine_grow_arena(bc_eng *e, int64_t need)
{
    int64_t r, n = e->scal[2], used = 0, size, s;
    int32_t *ar;
    for (r = 0; r < n; r++)
        if (e->lr[r].state == BC_LEASE_ACTIVE || e->lr[r].state == BC_LEASE_REVOKING)
            used += e->lr[r].units;
    size = e->A;
    if (used + need > size / 2)
        size = 2 * size > used + need ? 2 * size : used + need;
    ar = engine_zalloc((size_t)size, sizeof(int32_t));
    if (ar == NULL)
        return BC_ENOMEM;
    used = 0;
    for (r = 0; r < n; r++) {
        s = e->lr[r].state;
        if (s == BC_LEASE_ACTIVE || s == BC_LEASE_REVOKING) {
            memcpy(ar + used, e->arena + e->lr[r].slot_off,
                   (size_t)e->lr[r].units * sizeof(int32_t));
            e->lr[r].slot_off = used;
            used += e->lr[r].units;
        }
    }
    free(e->arena);
    e->arena = ar;
    e->A = size;
    e->arena_top[0] = used;
    return BC_OK;
}

/* Room for one more lease of n units on d, and for its expiry. */
static int engine_reserve(bc_eng *e, int64_t d, int64_t n)
{
    int st;
    if (e->scal[2] + 1 > e->L && !k_reusable(e)) {
        st = engine_grow_leases(e, 2 * e->L > 1024 ? 2 * e->L : 1024);
        if (st)
            return st;
    }
    if (n > e->top[d])
        n = e->top[d];          /* never more slot ids than are free now */
    if (e->arena_top[0] + n > e->A) {
        st = engine_grow_arena(e, n);
        if (st)
            return st;
    }
    if (e->scal[3] + 2 > e->HC)
        return engine_grow_heap(e);
    return BC_OK;
}

int bc_engine_new(const bc_engine_config *c, bc_engine **out)
{
    bc_engine *x;
    bc_eng *e;
    int64_t D, K, NT, d, j, width = 1;
    if (out == NULL)
        return BC_EINVAL;
    *out = NULL;
    if (c == NULL || c->capacity == NULL || c->headroom == NULL || c->price == NULL
            || c->class_table == NULL || c->cong_mult == NULL
            || (c->thresholds > 0 && c->cong_thresholds == NULL))
        return BC_EINVAL;
    D = c->dims;
    K = c->classes;
    NT = c->thresholds;
    if (D < 1 || K < 1 || NT < 0 || c->bins < 1 || c->window_ns < 1 || c->half_life_ns < 1)
        return BC_ERANGE;
    for (d = 0; d < D; d++) {
        if (c->capacity[d] < 0 || c->capacity[d] > INT32_MAX || c->headroom[d] < 0
                || c->price[d] < 0 || c->price[d] > BC_MAX_AMOUNT)
            return BC_ERANGE;
        if (c->capacity[d] > width)
            width = c->capacity[d];
    }
    x = calloc(1, sizeof(*x));
    if (x == NULL)
        return BC_ENOMEM;
    e = &x->e;
    e->D = D;
    e->K = K;
    e->NT = NT;
    e->bins = c->bins;
    e->bin_ns = c->window_ns / c->bins > 0 ? c->window_ns / c->bins : 1;
    e->W = width;
    e->cap = engine_dup64(c->capacity, (size_t)D);
    e->headroom = engine_dup64(c->headroom, (size_t)D);
    e->price = engine_dup64(c->price, (size_t)D);
    e->occ = engine_dup64(NULL, (size_t)D);
    e->prom = engine_dup64(NULL, (size_t)D);
    e->rev = engine_dup64(NULL, (size_t)D);
    e->resv = engine_dup64(NULL, (size_t)D);
    e->F = engine_dup64(NULL, (size_t)D);
    e->U = engine_dup64(NULL, (size_t)D);
    e->oppa = engine_dup64(NULL, (size_t)D);
    e->pend = engine_dup64(NULL, (size_t)D);
    e->gsum = engine_dup64(NULL, (size_t)D);
    e->cls = engine_dup64(c->class_table, (size_t)(K * BC_K_NCOL));
    e->cong_thr = engine_dup64(c->cong_thresholds, (size_t)NT);
    e->cong_mult = engine_dup64(c->cong_mult, (size_t)(NT + 1));
    e->ring = engine_dup64(NULL, (size_t)(D * c->bins));
    e->ring_sum = engine_dup64(NULL, (size_t)D);
    e->scal = engine_dup64(NULL, 4);
    e->free_slots = engine_zalloc((size_t)(D * width), sizeof(int32_t));
    e->top = engine_dup64(NULL, (size_t)D);
    e->fs_par = engine_dup64(NULL, 2);
    e->lfree = engine_dup64(NULL, 3);
    e->arena_top = engine_dup64(NULL, 1);
    e->cd = engine_zalloc(1, sizeof(bc_cdrow));
    e->cr = engine_zalloc(1, sizeof(bc_crow));
    e->gch = engine_dup64(NULL, 1);
    e->Hsub = engine_dup64(NULL, 1);
    e->bor = engine_dup64(NULL, BC_BOR_NCOL);
    e->sib = engine_dup64(NULL, BC_SIB_NCOL);     /* the pool's row: no campaign yet */
    e->lr = engine_zalloc(1, sizeof(bc_lrow));
    e->freeq = engine_dup64(NULL, 1);
    e->arena = engine_zalloc(1, sizeof(int32_t));
    e->heap_t = engine_dup64(NULL, 1);
    e->heap_id = engine_dup64(NULL, 1);
    if (!e->cap || !e->headroom || !e->price || !e->occ || !e->prom || !e->rev || !e->resv
            || !e->F || !e->U || !e->oppa || !e->pend || !e->gsum || !e->cls || !e->cong_thr
            || !e->cong_mult || !e->ring || !e->ring_sum || !e->scal || !e->free_slots
            || !e->top || !e->fs_par || !e->lfree || !e->arena_top || !e->cd || !e->cr
            || !e->gch || !e->Hsub || !e->bor || !e->sib || !e->lr || !e->freeq || !e->arena
            || !e->heap_t || !e->heap_id) {
        bc_engine_free(x);
        return BC_ENOMEM;
    }
    e->scal[1] = c->instant != 0;
    e->fs_par[0] = c->half_life_ns;
    e->lfree[2] = c->reuse_after < 0 ? -1 : c->reuse_after;
    for (d = 0; d < D; d++) {       /* a stack of free slot ids: slot 0 is taken first */
        for (j = 0; j < c->capacity[d]; j++)
            e->free_slots[d * width + j] = (int32_t)(c->capacity[d] - 1 - j);
        e->top[d] = c->capacity[d];
    }
    if (engine_grow_leases(e, 1024) || engine_grow_arena(e, 8192)) {
        bc_engine_free(x);
        return BC_ENOMEM;
    }
    *out = x;
    return BC_OK;
}

/* A campaign registered at `now`, top-level (p < 0) or a child of node p (§14.1): its
 * guarantee within the pool's (top level) or with its siblings' within p's. */
static int engine_add(bc_engine *x, int64_t p, const int64_t *g, const int64_t *s,
                      const int64_t *b, const int64_t *bucket, int64_t credits, int64_t now,
                      int64_t *index)
{
    bc_eng *e;
    int64_t d, D, i, n, *gch, *hsub, *bor, *sib;
    bc_cdrow *cd;
    bc_crow *cr;
    if (x == NULL || g == NULL || s == NULL || b == NULL || bucket == NULL)
        return BC_EINVAL;
    e = &x->e;
    D = e->D;
    if (credits < 0 || credits > BC_MAX_AMOUNT || now < -BC_MAX_TIME || now > BC_MAX_TIME)
        return BC_ERANGE;
    for (d = 0; d < D; d++)
        if (g[d] < 0 || s[d] < g[d] || b[d] < s[d] || b[d] > BC_MAX_AMOUNT || bucket[d] < 0
                || bucket[d] > BC_MAX_AMOUNT
                || (p < 0 ? e->gsum[d] + g[d] > e->cap[d]
                          : e->gch[p * D + d] + g[d] > e->cd[p * D + d].g))
            return BC_ERANGE;
    if (x->C == e->calloc) {
        n = e->calloc ? 2 * e->calloc : 16;
        cd = engine_zalloc((size_t)(n * D), sizeof(bc_cdrow));
        cr = engine_zalloc((size_t)n, sizeof(bc_crow));
        gch = engine_zalloc((size_t)(n * D), sizeof(int64_t));
        hsub = engine_zalloc((size_t)(n * D), sizeof(int64_t));
        bor = engine_zalloc((size_t)(n * D * BC_BOR_NCOL), sizeof(int64_t));
        sib = engine_zalloc((size_t)((n + 1) * BC_SIB_NCOL), sizeof(int64_t));
        if (cd == NULL || cr == NULL || gch == NULL || hsub == NULL || bor == NULL
                || sib == NULL) {
            free(cd); free(cr); free(gch); free(hsub); free(bor); free(sib);
            return BC_ENOMEM;
        }
        memcpy(cd, e->cd, (size_t)(x->C * D) * sizeof(bc_cdrow));
        memcpy(cr, e->cr, (size_t)x->C * sizeof(bc_crow));
        memcpy(gch, e->gch, (size_t)(x->C * D) * sizeof(int64_t));
        memcpy(hsub, e->Hsub, (size_t)(x->C * D) * sizeof(int64_t));
        memcpy(bor, e->bor, (size_t)(x->C * D * BC_BOR_NCOL) * sizeof(int64_t));
        memcpy(sib, e->sib, (size_t)((x->C + 1) * BC_SIB_NCOL) * sizeof(int64_t));
        free(e->cd); free(e->cr); free(e->gch); free(e->Hsub); free(e->bor); free(e->sib);
        e->cd = cd;
        e->cr = cr;
        e->gch = gch;
        e->Hsub = hsub;
        e->bor = bor;
        e->sib = sib;
        e->calloc = n;
    }
    for (d = 0; d < D; d++) {
        i = x->C * D + d;
        e->cd[i].g = g[d];
        e->cd[i].s = s[d];
        e->cd[i].b = b[d];
        e->cd[i].Bcap = bucket[d];
        e->cd[i].T = bucket[d];
        e->cd[i].tlast = now;
        e->bor[i * BC_BOR_NCOL + BC_BOR_LEND] = BC_MAXV;     /* lends without a limit */
        if (p < 0) {
            e->U[d] += g[d];
            e->gsum[d] += g[d];
        }
    }
    e->cr[x->C].budget = credits;
    e->cr[x->C].left = credits;
    if (p >= 0)
        k_link(e, x->C, p, now);
    else
        k_enlist(e, x->C, -1);
    if (index != NULL)
        *index = x->C;
    x->C += 1;
    return BC_OK;
}

int bc_engine_add_campaign(bc_engine *x, const int64_t *g, const int64_t *s, const int64_t *b,
                           const int64_t *bucket, int64_t credits, int64_t now, int64_t *index)
{
    return engine_add(x, -1, g, s, b, bucket, credits, now, index);
}

int bc_engine_add_node(bc_engine *x, int64_t parent, const int64_t *g, const int64_t *s,
                       const int64_t *b, const int64_t *bucket, int64_t credits, int64_t now,
                       int64_t *index)
{
    int64_t d, path[BC_TREE_DEPTH];
    if (x == NULL || g == NULL)
        return BC_EINVAL;
    if (parent >= x->C)
        return BC_EINDEX;
    if (parent >= 0 && k_path_of(&x->e, parent, path) == BC_TREE_DEPTH)   /* no level left below */
        return BC_ERANGE;
    if (parent >= 0 && x->e.lex == NULL) {     /* the first node of a tree */
        x->e.lex = engine_zalloc((size_t)x->e.L * (BC_TREE_DEPTH - 1), sizeof(int64_t));
        if (x->e.lex == NULL)
            return BC_ENOMEM;
    }
    for (d = 0; d < x->e.D; d++)
        if (g[d] < 0 || g[d] > k_child_room(&x->e, parent, d)
                || (parent >= 0 && g[d] > k_child_load_room(&x->e, parent, d)))
            return BC_ERANGE;
    return engine_add(x, parent < 0 ? -1 : parent, g, s, b, bucket, credits, now, index);
}

int bc_engine_change_node(bc_engine *x, int64_t index, const int64_t *g, const int64_t *s,
                          const int64_t *b, const int64_t *bucket, int64_t credits, int64_t now)
{
    bc_eng *e;
    int64_t d, D, i, p, g0, budget;
    if (x == NULL || g == NULL || s == NULL || b == NULL || bucket == NULL)
        return BC_EINVAL;
    if (index < 0 || index >= x->C)
        return BC_EINDEX;
    e = &x->e;
    D = e->D;
    p = k_parent_of(e, index);
    budget = e->cr[index].budget;
    if (credits < 0 || credits > BC_MAX_AMOUNT || now < -BC_MAX_TIME || now > BC_MAX_TIME
            || (credits == BC_MAX_AMOUNT) != (budget == BC_MAX_AMOUNT)
            || (budget != BC_MAX_AMOUNT && e->cr[index].left + (credits - budget) < 0))
        return BC_ERANGE;
    for (d = 0; d < D; d++) {
        i = index * D + d;
        g0 = e->cd[i].g;
        if (g[d] < 0 || s[d] < g[d] || b[d] < s[d] || b[d] > BC_MAX_AMOUNT || bucket[d] < 0
                || bucket[d] > BC_MAX_AMOUNT || e->gch[i] > g[d]
                || (p < 0 ? e->gsum[d] - g0 + g[d] > e->cap[d]
                          : e->gch[p * D + d] - g0 + g[d] > e->cd[p * D + d].g))
            return BC_ERANGE;
        if (g[d] > g0 && (g[d] - g0 > k_child_room(e, p, d)
                          || (p >= 0 && g[d] - g0 > k_child_load_room(e, p, d))))
            return BC_ERANGE;
    }
    k_change_node(e, index, g, s, b, bucket, credits, now);
    return BC_OK;
}

int bc_engine_set_borrowing(bc_engine *x, int64_t index, const int64_t *borrow_limit,
                            const int64_t *lend_limit)
{
    int64_t d, i, *b;
    int borrows = 0;
    if (x == NULL || borrow_limit == NULL || lend_limit == NULL)
        return BC_EINVAL;
    if (index < 0 || index >= x->C)
        return BC_EINDEX;
    for (d = 0; d < x->e.D; d++)
        if (borrow_limit[d] < 0 || borrow_limit[d] > BC_MAX_AMOUNT || lend_limit[d] < 0)
            return BC_ERANGE;
    for (d = 0; d < x->e.D; d++)
        borrows |= borrow_limit[d] > 0;
    if (borrows && x->e.cd[index * x->e.D].up == 0) {
        /* a flat borrower is the root of a tree of its own: its decisions take the tree's
           walk, which weighs borrowing (a flat campaign pays nothing for it) */
        if (x->e.lex == NULL) {
            x->e.lex = engine_zalloc((size_t)x->e.L * (BC_TREE_DEPTH - 1), sizeof(int64_t));
            if (x->e.lex == NULL)
                return BC_ENOMEM;
        }
        k_make_root(&x->e, index);
    }
    for (d = 0; d < x->e.D; d++) {
        b = x->e.bor + (index * x->e.D + d) * BC_BOR_NCOL;
        b[BC_BOR_LIMIT] = borrow_limit[d];
        b[BC_BOR_LEND] = lend_limit[d] > BC_MAX_AMOUNT ? BC_MAXV : lend_limit[d];
    }
    return BC_OK;
}

int bc_engine_advance(bc_engine *x, int64_t now, int64_t *expired, size_t room, size_t *count)
{
    int64_t buf[64], m;
    size_t total = 0, k;
    int err = 0;
    if (x == NULL || (room > 0 && expired == NULL))
        return BC_EINVAL;
    if (now < -BC_MAX_TIME || now > BC_MAX_TIME)
        return BC_ERANGE;
    do {
        m = k_advance(&x->e, now, buf, 64, &err);
        if (err)
            return BC_ERANGE;
        for (k = 0; k < (size_t)m; k++)
            if (total + k < room)
                expired[total + k] = buf[k];
        total += (size_t)m;
    } while (m == 64);
    k_ring_advance(&x->e, now);
    if (count != NULL)
        *count = total;
    return BC_OK;
}

static int engine_request_ok(const bc_engine *x, int64_t c, int32_t d, int32_t k)
{
    return c >= 0 && c < x->C && d >= 0 && d < x->e.D && k >= 0 && k < x->e.K;
}

int bc_engine_acquire(bc_engine *x, int64_t c, int32_t d, int32_t k, int64_t nmin,
                      int64_t nmax, int64_t dur, int64_t max_spend, int64_t now,
                      int64_t intent, bc_decision *out)
{
    int64_t buf[4];
    int rc;
    if (x == NULL || out == NULL)
        return BC_EINVAL;
    if (!engine_request_ok(x, c, d, k))
        return BC_EINDEX;
    if (nmin < 0 || nmax < nmin || nmax > BC_MAX_AMOUNT || dur < 1 || dur > BC_MAX_TIME
            || max_spend > BC_MAX_AMOUNT)
        return BC_ERANGE;
    rc = bc_engine_advance(x, now, NULL, 0, NULL);
    if (rc)
        return rc;
    for (;;) {
        rc = engine_reserve(&x->e, d, nmax);
        if (rc)
            return rc;
        rc = k_admit(&x->e, c, d, k, nmin, nmax, dur, max_spend, now, intent, buf, NULL);
        if (rc != BC_E_HEAPFULL && rc != BC_E_LEASES && rc != BC_E_ARENA)
            break;
    }
    if (rc < 0)
        return BC_ERANGE;
    out->outcome = rc;
    out->units = rc == BC_GRANTED ? buf[0] : 0;
    out->reason = (int32_t)buf[1];
    out->lease = buf[2];
    out->charge = buf[3];
    return BC_OK;
}

int bc_engine_renew(bc_engine *x, int64_t lid, int64_t ext, int64_t max_spend, int64_t now,
                    bc_decision *out)
{
    bc_i128 price = 0;
    int64_t r;
    int rc;
    if (x == NULL || out == NULL)
        return BC_EINVAL;
    if (ext < 1 || ext > BC_MAX_TIME || max_spend > BC_MAX_AMOUNT)
        return BC_ERANGE;
    rc = bc_engine_advance(x, now, NULL, 0, NULL);
    if (rc)
        return rc;
    r = k_row(&x->e, lid);
    if (r < 0 || r >= x->e.scal[2] || x->e.lr[r].state != BC_LEASE_ACTIVE)
        return BC_EINDEX;
    for (;;) {
        if (x->e.scal[3] + 1 > x->e.HC && engine_grow_heap(&x->e))
            return BC_ENOMEM;
        rc = k_renew(&x->e, lid, ext, now, max_spend, &price);
        if (rc != BC_E_HEAPFULL)
            break;
    }
    if (rc < 0)
        return BC_ERANGE;
    out->outcome = rc == BC_REASON_NONE ? BC_GRANTED : BC_REFUSED;
    out->reason = rc;
    out->units = x->e.lr[r].units;
    out->lease = lid;
    out->charge = rc == BC_REASON_NONE ? (int64_t)price : 0;
    return BC_OK;
}

int bc_engine_release(bc_engine *x, int64_t lid, int64_t now)
{
    int64_t r;
    int rc;
    if (x == NULL)
        return BC_EINVAL;
    rc = bc_engine_advance(x, now, NULL, 0, NULL);
    if (rc)
        return rc;
    r = k_row(&x->e, lid);
    if (r < 0 || r >= x->e.scal[2])
        return BC_EINDEX;
    rc = k_end_lease(&x->e, lid, now, BC_LEASE_RELEASED);
    if (rc == BC_E_ENDED)
        return BC_EINDEX;
    return rc ? BC_ERANGE : BC_OK;
}

int bc_engine_lease(const bc_engine *x, int64_t lid, bc_lease_info *out)
{
    int64_t r;
    const bc_lrow *l;
    if (x == NULL || out == NULL)
        return BC_EINVAL;
    r = k_row(&x->e, lid);
    if (r < 0 || r >= x->e.scal[2])
        return BC_EINDEX;
    l = &x->e.lr[r];
    out->campaign = l->camp;
    out->dim = (int32_t)l->dim;
    out->cls = (int32_t)l->lcls;
    out->units = l->units;
    out->state = (int32_t)l->state;
    out->granted_at = l->t_grant;
    out->starts_at = l->t_start;
    out->ends_at = l->t_end;
    out->charge = l->cost;
    return BC_OK;
}

int bc_engine_balance(bc_engine *x, int64_t c, int32_t d, int64_t now, int64_t *credits,
                      int64_t *held, int64_t *tokens)
{
    const bc_cdrow *cd;
    if (x == NULL)
        return BC_EINVAL;
    if (c < 0 || c >= x->C || d < 0 || d >= x->e.D)
        return BC_EINDEX;
    if (now < -BC_MAX_TIME || now > BC_MAX_TIME)
        return BC_ERANGE;
    k_settle(&x->e, c, d, now);
    cd = &x->e.cd[c * x->e.D + d];
    if (credits != NULL)
        *credits = x->e.cr[c].left;
    if (held != NULL)                 /* a node of a tree: its subtree's (§14.2) */
        *held = k_held(&x->e, c, d);
    if (tokens != NULL)
        *tokens = cd->T;
    return BC_OK;
}
