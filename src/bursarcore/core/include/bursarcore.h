/*
 * bursarcore.h: the public C ABI of bursarcore's decision core.
 *
 * C11, no Python headers. Link against the shared library that
 * bursarcore.get_library() names, with -I the folder bursarcore.get_include() names.
 * docs/c-api.md is the guide: ownership, thread rules and the versioning promise.
 *
 * Units (docs/spec.md §2): time is int64 nanoseconds; amounts, capacities and rates are
 * int64 fixed point, 10^6 per unit (BC_SCALE), rates per second. A value outside the
 * documented range is refused with BC_ERANGE.
 *
 * Every function returns a status: BC_OK (0) or a negative error code; results go to
 * caller-owned out-parameters. A call that fails changes nothing. The core has no
 * global state, never aborts and never prints.
 */
#ifndef BURSARCORE_H
#define BURSARCORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI version this header describes. bc_abi_version() returns the library's; a
 * program built against version V runs with a library of version V and refuses others
 * (see docs/c-api.md). Additions that keep existing calls and structs unchanged do not
 * change it. */
#define BURSARCORE_ABI_VERSION 1

#define BC_SCALE 1000000LL          /* fixed-point units per unit */
#define BC_NS 1000000000LL          /* nanoseconds per second */
#define BC_MAX_TIME (1LL << 62)     /* |time| <= this, in ns */
#define BC_MAX_AMOUNT (1LL << 62)   /* capacities, rates, tokens, amounts: [0, this] */
#define BC_NEVER INT64_MAX          /* a wait that no amount of time ends */

/* --- cdef begin (the declarations below are read by the cffi binding as written) --- */

/* Status codes. */
enum {
    BC_OK = 0,
    BC_EINVAL = -1,     /* a NULL handle or pointer, or a length that does not agree */
    BC_ERANGE = -2,     /* a value outside its documented range */
    BC_EINDEX = -3,     /* a bucket index outside [0, len) */
    BC_ETIME = -4,      /* a time before the bucket's (or the table's) last update */
    BC_ENOMEM = -5,     /* growth failed; nothing changed */
    BC_ETOKENS = -6     /* tokens above the capacity */
};

int bc_abi_version(void);
const char *bc_strerror(int status);

/* --- token buckets (docs/spec.md §3) -------------------------------------------------
 * A table of buckets, each with a capacity C, a refill rate r (fixed point per second),
 * tokens T (0 <= T <= C) and the time of its last update. Refill is exact: the sub-unit
 * remainder of r * dt is kept, so settling at t1 then t2 equals settling at t2. Times
 * given to a bucket never go backwards; the table's watermark is the newest time any
 * operation used. */
typedef struct bc_buckets bc_buckets;

/* One bucket's full state, as bc_buckets_get returns and bc_buckets_push takes it. */
typedef struct bc_bucket_state {
    int64_t capacity;
    int64_t rate;
    int64_t tokens;
    int64_t remainder;  /* fixed-point nanoseconds, in [0, BC_NS) */
    int64_t last;       /* ns */
} bc_bucket_state;

/* A new, empty table with room for `reserve` buckets (0: a small default), whose
 * watermark is `now`. NULL out on failure. Free it with bc_buckets_free. */
int bc_buckets_new(size_t reserve, int64_t now, bc_buckets **out);
void bc_buckets_free(bc_buckets *b);

size_t bc_buckets_len(const bc_buckets *b);
int64_t bc_buckets_watermark(const bc_buckets *b);

/* Appends a full bucket (tokens = capacity when tokens < 0) last updated at `now`, which
 * must not be before the watermark. Its index goes to *index (may be NULL). */
int bc_buckets_append(bc_buckets *b, int64_t capacity, int64_t rate, int64_t tokens,
                      int64_t now, size_t *index);

/* Appends n full or partly full buckets, all last updated at `now` (not before the
 * watermark): tokens NULL means full. All or nothing: on an error *bad (when not NULL) is
 * the first offending position and no bucket is added. */
int bc_buckets_extend(bc_buckets *b, const int64_t *capacity, const int64_t *rate,
                      const int64_t *tokens, size_t n, int64_t now, size_t *bad);

/* Appends a bucket with its whole state (a restore): remainder in [0, BC_NS), last <=
 * watermark is not required; the watermark becomes max(watermark, s->last). */
int bc_buckets_push(bc_buckets *b, const bc_bucket_state *s);

/* The state of bucket i, unsettled (as last written). */
int bc_buckets_get(const bc_buckets *b, size_t i, bc_bucket_state *out);

/* Every bucket's state as columns, unsettled: each non-NULL array has room for n >= len
 * entries. */
int bc_buckets_columns(const bc_buckets *b, int64_t *capacity, int64_t *rate,
                       int64_t *tokens, int64_t *remainder, int64_t *last, size_t n);

/* Settles bucket i at `now`, then takes `amount` if it holds that many tokens:
 * *granted = 1 (taken) or 0 (left as it was). */
int bc_buckets_try_debit(bc_buckets *b, size_t i, int64_t amount, int64_t now,
                         int *granted);

/* n requests in order: request k settles bucket idx[k] at now[k] and takes amount[k] if
 * it can, so request k sees the effect of the requests before it; granted[k] = 1 or 0.
 * n_amount and n_now are n, or 1 for one amount or one instant for every request. Times must not decrease per bucket nor
 * precede a bucket's last update; every index, amount and time is checked before any
 * bucket changes. On an error, *bad (when bad is not NULL) is the position of the first
 * index or amount out of range, or else of the first time refused. */
int bc_buckets_try_debit_batch(bc_buckets *b, const int64_t *idx, size_t n,
                               const int64_t *amount, size_t n_amount,
                               const int64_t *now, size_t n_now,
                               uint8_t *granted, size_t *bad);

/* The same batch with amounts in units and times in seconds as doubles (a host
 * language's floats), each converted as llrint(x * BC_SCALE) and llrint(x * BC_NS) (the
 * conversion of bursarcore.units, so the same integers). A value that is not finite or
 * is out of range is refused with BC_ERANGE, as an integer one would be. */
int bc_buckets_try_debit_batch_f64(bc_buckets *b, const int64_t *idx, size_t n,
                                   const double *amount, size_t n_amount,
                                   const double *now, size_t n_now,
                                   uint8_t *granted, size_t *bad);

/* Settles bucket i at `now`, then credits up to `amount` (never beyond the capacity);
 * what was credited goes to *credited. */
int bc_buckets_refund(bc_buckets *b, size_t i, int64_t amount, int64_t now,
                      int64_t *credited);

/* Settles bucket i at `now` under its old rate, then sets the new one. */
int bc_buckets_set_rate(bc_buckets *b, size_t i, int64_t rate, int64_t now);

/* Tokens of every bucket at `now` (>= the watermark), without changing any: out has
 * room for n >= len entries. */
int bc_buckets_peek(const bc_buckets *b, int64_t now, int64_t *out, size_t n);

/* Nanoseconds from `now` until bucket i holds `amount` (0 if it does now), without
 * changing it; BC_NEVER when the amount exceeds the capacity, the rate is 0, or the wait
 * would exceed BC_MAX_TIME ns. */
int bc_buckets_time_until(const bc_buckets *b, size_t i, int64_t amount, int64_t now,
                          int64_t *wait);

/* --- cdef end --- */

#ifdef __cplusplus
}
#endif

#endif /* BURSARCORE_H */
