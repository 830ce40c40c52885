/*
 * The token-bucket table of the C ABI (bursarcore.h). One 64-byte row per bucket
 * (size, rate, tokens, remainder, last update, 3 words of scratch), so a random access
 * touches one cache line; rows are 64-byte aligned.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bucket.h"
#include "bursarcore.h"

#define W 8             /* int64 per row */
#define LAST 4
#define SEEN 5          /* scratch: a batch's validation pass */
#define AHEAD 16        /* the batch prefetches the row this many requests ahead */

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH_W(p) __builtin_prefetch((p), 1, 3)
#define BC_ALWAYS_INLINE static inline __attribute__((always_inline))
#else
#define PREFETCH_W(p) ((void)(p))
#define BC_ALWAYS_INLINE static inline
#endif

struct bc_buckets {
    int64_t *rows;
    size_t n;
    size_t alloc;
    int64_t wm;         /* the newest time any operation used */
};

static int64_t *row(const bc_buckets *b, size_t i)
{
    return b->rows + i * W;
}

static int amount_ok(int64_t x)
{
    return x >= 0 && x <= BC_MAX_AMOUNT;
}

static int time_ok(int64_t t)
{
    return t >= -BC_MAX_TIME && t <= BC_MAX_TIME;
}

/* Room for `need` rows; on failure nothing changes. */
static int reserve(bc_buckets *b, size_t need)
{
    size_t alloc = b->alloc ? b->alloc : 16;
    int64_t *rows;
    if (need <= b->alloc)
        return BC_OK;
    while (alloc < need) {
        if (alloc > SIZE_MAX / 2 / (W * sizeof(int64_t)))
            return BC_ENOMEM;
        alloc *= 2;
    }
    rows = aligned_alloc(64, alloc * W * sizeof(int64_t));
    if (rows == NULL)
        return BC_ENOMEM;
    if (b->n)
        memcpy(rows, b->rows, b->n * W * sizeof(int64_t));
    free(b->rows);
    b->rows = rows;
    b->alloc = alloc;
    return BC_OK;
}

/* Settle bucket r at t (t >= its last update). */
static inline void refill(int64_t *r, int64_t t)
{
    if (t > r[LAST]) {
        /* t and last lie in [-2**62, 2**62]: t - last can reach 2**63, so 128 bits */
        bc_i128 dt = (bc_i128)t - r[LAST];
        r[LAST] = t;
        bc_bucket_settle(r, dt);
    }
}

static inline void touch(bc_buckets *b, int64_t t)
{
    if (t > b->wm)
        b->wm = t;
}

/* The checks of a one-bucket operation at t. */
static int at(const bc_buckets *b, size_t i, int64_t t)
{
    if (b == NULL)
        return BC_EINVAL;
    if (!time_ok(t))
        return BC_ERANGE;
    if (i >= b->n)
        return BC_EINDEX;
    if (t < row(b, i)[LAST])
        return BC_ETIME;
    return BC_OK;
}

/* The start of a one-bucket update: every check (value is the amount or rate, out the
 * caller's result pointer), then bucket i settled at `now`, its row in *r. */
static int begin(bc_buckets *b, size_t i, int64_t value, int64_t now, const void *out,
                 int64_t **r)
{
    int st = at(b, i, now);
    if (st != BC_OK)
        return st;
    if (out == NULL)
        return BC_EINVAL;
    if (!amount_ok(value))
        return BC_ERANGE;
    *r = row(b, i);
    refill(*r, now);
    touch(b, now);
    return BC_OK;
}

int bc_buckets_new(size_t reserve_n, int64_t now, bc_buckets **out)
{
    bc_buckets *b;
    if (out == NULL)
        return BC_EINVAL;
    *out = NULL;
    if (!time_ok(now))
        return BC_ERANGE;
    b = calloc(1, sizeof *b);
    if (b == NULL)
        return BC_ENOMEM;
    b->wm = now;
    if (reserve(b, reserve_n ? reserve_n : 16) != BC_OK) {
        free(b);
        return BC_ENOMEM;
    }
    *out = b;
    return BC_OK;
}

void bc_buckets_free(bc_buckets *b)
{
    if (b != NULL) {
        free(b->rows);
        free(b);
    }
}

size_t bc_buckets_len(const bc_buckets *b)
{
    return b ? b->n : 0;
}

int64_t bc_buckets_watermark(const bc_buckets *b)
{
    return b ? b->wm : 0;
}

static int push(bc_buckets *b, int64_t cap, int64_t rate, int64_t tok, int64_t rem,
                int64_t last)
{
    int64_t *r;
    int st = reserve(b, b->n + 1);
    if (st != BC_OK)
        return st;
    r = row(b, b->n);
    memset(r, 0, W * sizeof(int64_t));
    r[BC_B_SIZE] = cap;
    r[BC_B_RATE] = rate;
    r[BC_B_TOK] = tok;
    r[BC_B_REM] = rem;
    r[LAST] = last;
    b->n++;
    return BC_OK;
}

int bc_buckets_append(bc_buckets *b, int64_t capacity, int64_t rate, int64_t tokens,
                      int64_t now, size_t *index)
{
    int st;
    if (b == NULL)
        return BC_EINVAL;
    if (tokens < 0)
        tokens = capacity;
    if (!amount_ok(capacity) || !amount_ok(rate) || !time_ok(now))
        return BC_ERANGE;
    if (tokens > capacity)
        return BC_ETOKENS;
    if (now < b->wm)
        return BC_ETIME;
    st = push(b, capacity, rate, tokens, 0, now);
    if (st != BC_OK)
        return st;
    touch(b, now);
    if (index != NULL)
        *index = b->n - 1;
    return BC_OK;
}

int bc_buckets_extend(bc_buckets *b, const int64_t *capacity, const int64_t *rate,
                      const int64_t *tokens, size_t n, int64_t now, size_t *bad)
{
    size_t k;
    int st;
    if (b == NULL || (n && (capacity == NULL || rate == NULL)))
        return BC_EINVAL;
    if (!time_ok(now))
        return BC_ERANGE;
    if (now < b->wm)
        return BC_ETIME;
    for (k = 0; k < n; k++) {
        int64_t tok = tokens ? tokens[k] : capacity[k];
        st = !amount_ok(capacity[k]) || !amount_ok(rate[k]) || !amount_ok(tok) ? BC_ERANGE
            : tok > capacity[k] ? BC_ETOKENS : BC_OK;
        if (st != BC_OK) {
            if (bad != NULL)
                *bad = k;
            return st;
        }
    }
    if (n > SIZE_MAX - b->n)
        return BC_ENOMEM;
    st = reserve(b, b->n + n);
    if (st != BC_OK)
        return st;
    for (k = 0; k < n; k++)
        push(b, capacity[k], rate[k], tokens ? tokens[k] : capacity[k], 0, now);
    touch(b, now);
    return BC_OK;
}

int bc_buckets_push(bc_buckets *b, const bc_bucket_state *s)
{
    int st;
    if (b == NULL || s == NULL)
        return BC_EINVAL;
    if (!amount_ok(s->capacity) || !amount_ok(s->rate) || !amount_ok(s->tokens)
            || s->remainder < 0 || s->remainder >= BC_NS || !time_ok(s->last))
        return BC_ERANGE;
    if (s->tokens > s->capacity)
        return BC_ETOKENS;
    st = push(b, s->capacity, s->rate, s->tokens, s->remainder, s->last);
    if (st != BC_OK)
        return st;
    touch(b, s->last);
    return BC_OK;
}

int bc_buckets_get(const bc_buckets *b, size_t i, bc_bucket_state *out)
{
    const int64_t *r;
    if (b == NULL || out == NULL)
        return BC_EINVAL;
    if (i >= b->n)
        return BC_EINDEX;
    r = row(b, i);
    out->capacity = r[BC_B_SIZE];
    out->rate = r[BC_B_RATE];
    out->tokens = r[BC_B_TOK];
    out->remainder = r[BC_B_REM];
    out->last = r[LAST];
    return BC_OK;
}

int bc_buckets_columns(const bc_buckets *b, int64_t *capacity, int64_t *rate,
                       int64_t *tokens, int64_t *remainder, int64_t *last, size_t n)
{
    int64_t *cols[5] = {capacity, rate, tokens, remainder, last};
    size_t k, j;
    if (b == NULL || n < b->n)
        return BC_EINVAL;
    for (j = 0; j < 5; j++)
        if (cols[j] != NULL)
            for (k = 0; k < b->n; k++)
                cols[j][k] = row(b, k)[j];
    return BC_OK;
}

int bc_buckets_try_debit(bc_buckets *b, size_t i, int64_t amount, int64_t now,
                         int *granted)
{
    int64_t *r;
    int st = begin(b, i, amount, now, granted, &r);
    if (st != BC_OK)
        return st;
    if (r[BC_B_TOK] >= amount) {
        r[BC_B_TOK] -= amount;
        *granted = 1;
    } else {
        *granted = 0;
    }
    return BC_OK;
}

/* A batch's inputs: int64 fixed point and ns, or (f64) doubles in units and seconds
 * converted here as the Python edge converts them (llrint of the IEEE product, so the
 * same integers as bursarcore.units). one: a single value for every request. */
typedef struct {
    const void *p;
    int one;
    int f64;
    double scale;       /* f64: BC_SCALE or BC_NS */
} column;

BC_ALWAYS_INLINE int64_t value(column c, size_t k)
{
    size_t j = c.one ? 0 : k;
    return c.f64 ? (int64_t)llrint(((const double *)c.p)[j] * c.scale)
                 : ((const int64_t *)c.p)[j];
}

/* An f64 input that llrint may convert: finite and within the range (NaN fails). */
BC_ALWAYS_INLINE int convertible(column c, size_t k, double lo, double hi)
{
    double x = ((const double *)c.p)[c.one ? 0 : k];
    return !c.f64 || (x >= lo && x <= hi);
}

#define MAX_UNITS_F ((double)BC_MAX_AMOUNT / (double)BC_SCALE)
#define MAX_SECONDS_F ((double)BC_MAX_TIME / (double)BC_NS)

/* Every check of a batch, before any bucket changes. The common batch (times sorted and
 * none before the watermark) needs one pass over the inputs; otherwise each touched row's
 * scratch word tracks the newest time seen for it, so times must not decrease per bucket. */
BC_ALWAYS_INLINE int batch_check(bc_buckets *b, const int64_t *idx, size_t n, column amount,
                                 size_t n_amount, column now, size_t n_now, size_t *bad)
{
    size_t k;
    int sorted = 1;
    int64_t prev = b->wm, t;
    uint64_t size = b->n, worst = 0;
    /* the common pass: OR of out-of-range flags, no branch per request */
    for (k = 0; k < n; k++)
        worst |= (uint64_t)idx[k] >= size;
    for (k = 0; k < n_amount; k++)
        worst |= !convertible(amount, k, 0.0, MAX_UNITS_F)
                 | ((uint64_t)value(amount, k) > (uint64_t)BC_MAX_AMOUNT);
    if (worst) {
        for (k = 0; (uint64_t)idx[k] < size && convertible(amount, k, 0.0, MAX_UNITS_F)
                    && amount_ok(value(amount, k)); k++)
            ;
        *bad = k;
        return (uint64_t)idx[k] >= size ? BC_EINDEX : BC_ERANGE;
    }
    for (k = 0; k < n_now; k++) {
        if (!convertible(now, k, -MAX_SECONDS_F, MAX_SECONDS_F) || !time_ok(t = value(now, k))) {
            *bad = k;
            return BC_ERANGE;
        }
        sorted &= t >= prev;
        prev = t;
    }
    if (sorted)
        return BC_OK;
    for (k = 0; k < n; k++)
        row(b, (size_t)idx[k])[SEEN] = row(b, (size_t)idx[k])[LAST];
    for (k = 0; k < n; k++) {
        int64_t *r = row(b, (size_t)idx[k]);
        t = value(now, k);
        if (t < r[SEEN]) {
            *bad = k;
            return BC_ETIME;
        }
        r[SEEN] = t;
    }
    return BC_OK;
}

/* The batch's loop, written once; inlined with constant flags into one copy per input
 * shape, so none tests per request whether a value is one for all or a double. */
BC_ALWAYS_INLINE int64_t debit_loop(int64_t *base, const int64_t *idx, size_t n,
                                    column amount, column now, uint8_t *granted)
{
    size_t k;
    int64_t *r, t = value(now, 0), a = value(amount, 0), newest = t;
    for (k = 0; k < n; k++) {
        /* random rows of a table larger than the cache each cost a memory round trip;
         * asking for row k + AHEAD now overlaps those trips. A prefetch never faults. */
        if (k + AHEAD < n)
            PREFETCH_W(base + idx[k + AHEAD] * W);
        r = base + idx[k] * W;
        if (!now.one)
            t = value(now, k);
        if (!amount.one)
            a = value(amount, k);
        refill(r, t);
        if (r[BC_B_TOK] >= a) {
            r[BC_B_TOK] -= a;
            granted[k] = 1;
        } else {
            granted[k] = 0;
        }
        if (!now.one && t > newest)
            newest = t;
    }
    return newest;
}

BC_ALWAYS_INLINE int batch(bc_buckets *b, const int64_t *idx, size_t n, const void *amount,
                           size_t n_amount, const void *now, size_t n_now, uint8_t *granted,
                           size_t *bad, int f64)
{
    size_t where = 0;
    int64_t newest;
    int st;
    column am = {amount, 0, f64, (double)BC_SCALE}, tm = {now, 0, f64, (double)BC_NS};
    if (b == NULL || (n && (idx == NULL || amount == NULL || now == NULL || granted == NULL)))
        return BC_EINVAL;
    if (n == 0)
        return BC_OK;
    if ((n_now != 1 && n_now != n) || (n_amount != 1 && n_amount != n))
        return BC_EINVAL;
    am.one = n_amount == 1;
    tm.one = n_now == 1;
    st = batch_check(b, idx, n, am, n_amount, tm, n_now, &where);
    if (st != BC_OK) {
        if (bad != NULL)
            *bad = where;
        return st;
    }
    /* constant flags (f64 is one too: batch is inlined into each entry point), so the
     * compiler makes one loop per shape */
#define LOOP(one_amount, one_now)                                                      \
    debit_loop(b->rows, idx, n, (column){amount, one_amount, f64, (double)BC_SCALE},  \
               (column){now, one_now, f64, (double)BC_NS}, granted)
    newest = am.one ? (tm.one ? LOOP(1, 1) : LOOP(1, 0)) : (tm.one ? LOOP(0, 1) : LOOP(0, 0));
#undef LOOP
    touch(b, newest);
    return BC_OK;
}

int bc_buckets_try_debit_batch(bc_buckets *b, const int64_t *idx, size_t n,
                               const int64_t *amount, size_t n_amount,
                               const int64_t *now, size_t n_now,
                               uint8_t *granted, size_t *bad)
{
    return batch(b, idx, n, amount, n_amount, now, n_now, granted, bad, 0);
}

int bc_buckets_try_debit_batch_f64(bc_buckets *b, const int64_t *idx, size_t n,
                                   const double *amount, size_t n_amount,
                                   const double *now, size_t n_now,
                                   uint8_t *granted, size_t *bad)
{
    return batch(b, idx, n, amount, n_amount, now, n_now, granted, bad, 1);
}

int bc_buckets_refund(bc_buckets *b, size_t i, int64_t amount, int64_t now,
                      int64_t *credited)
{
    int64_t *r;
    int st = begin(b, i, amount, now, credited, &r);
    if (st != BC_OK)
        return st;
    *credited = bc_bucket_refund(r, amount);
    return BC_OK;
}

int bc_buckets_set_rate(bc_buckets *b, size_t i, int64_t rate, int64_t now)
{
    int64_t *r;
    int st = begin(b, i, rate, now, b, &r);      /* (no result pointer: b stands in) */
    if (st != BC_OK)
        return st;
    r[BC_B_RATE] = rate;
    return BC_OK;
}

int bc_buckets_peek(const bc_buckets *b, int64_t now, int64_t *out, size_t n)
{
    size_t k;
    if (b == NULL || (b->n && out == NULL) || n < b->n)
        return BC_EINVAL;
    if (!time_ok(now))
        return BC_ERANGE;
    if (now < b->wm)
        return BC_ETIME;
    for (k = 0; k < b->n; k++) {
        const int64_t *r = row(b, k);
        out[k] = bc_bucket_level(r, (bc_i128)now - r[LAST]);
    }
    return BC_OK;
}

int bc_buckets_time_until(const bc_buckets *b, size_t i, int64_t amount, int64_t now,
                          int64_t *wait)
{
    int64_t tmp[4];
    const int64_t *r;
    int st = at(b, i, now);
    if (st != BC_OK)
        return st;
    if (wait == NULL)
        return BC_EINVAL;
    if (!amount_ok(amount))
        return BC_ERANGE;
    r = row(b, i);
    memcpy(tmp, r, sizeof tmp);
    if (now > r[LAST])
        bc_bucket_settle(tmp, (bc_i128)now - r[LAST]);
    *wait = bc_bucket_wait(tmp, amount);
    return BC_OK;
}

/* (this file is also compiled as part of unity.c: its short names end here) */
#undef W
#undef LAST
#undef SEEN
#undef AHEAD
#undef PREFETCH_W
#undef BC_ALWAYS_INLINE
