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
#define BC_TREE_DEPTH 8             /* the most levels of a tree of envelopes (§14) */

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


/* --- the admission engine (docs/spec.md §4–§7) ----------------------------------------
 * One pool of held dimensions (capacity in whole units, each unit a slot), service
 * classes, and campaigns with a guarantee, a sustained rate, a burst ceiling and a prepaid
 * token bucket per dimension and a credit budget; leases of units for a duration, granted
 * warm, renewed, released and expired. The engine decides what the rules decide; what
 * needs a policy (a reclaim of opportunistic leases, a pending request) comes back as
 * BC_DEFERRED, to the caller's policy layer. Times are int64 ns; tokens unit·ns; credits
 * micro-credits; prices micro-credits per unit-hour; multipliers ppm. */
typedef struct bc_engine bc_engine;

/* Outcomes of a request. */
enum { BC_GRANTED = 0, BC_REFUSED = 1, BC_DEFERRED = 2 };

/* Reasons (docs/spec.md §4.4), the codes of a decision's and a journal record's reason:
 * why a request was refused or pends, or none. The core decides those of a rule's limit
 * (below); the others are decided by the policy layer above it. Each name, lower-cased,
 * is the reason's name in every binding and in the journal. */
enum {
    BC_REASON_NONE = 0,
    BC_REASON_CAPACITY = 1,
    BC_REASON_TOKENS = 2,
    BC_REASON_CREDITS = 3,
    BC_REASON_CEILING = 4,
    BC_REASON_DEADLINE = 5,
    BC_REASON_TTL = 6,
    BC_REASON_INVALID = 7,
    BC_REASON_UNKNOWN_CAMPAIGN = 8,
    BC_REASON_CANCELLED = 9,
    BC_REASON_PENDING_LIMIT = 10,
    BC_REASONS = 11             /* the number of reason codes */
};

/* The rules whose limits size a request (docs/spec.md §4.4), in the order a refusal names
 * them: a request is refused (or pends) for the first rule, in this order, whose limit held
 * its size below its minimum. BC_LIMIT_X is decided as reason BC_REASON_X; a journal
 * record keeps the limits in this order (lim_x). */
enum {
    BC_LIMIT_CEILING = 0,
    BC_LIMIT_CAPACITY = 1,
    BC_LIMIT_TOKENS = 2,
    BC_LIMIT_CREDITS = 3,
    BC_LIMITS = 4               /* the number of rules with a limit */
};

/* Lease states (docs/spec.md §4.6). */
enum {
    BC_LEASE_STARTING = 0,
    BC_LEASE_ACTIVE = 1,
    BC_LEASE_REVOKING = 2,
    BC_LEASE_RELEASED = 3,
    BC_LEASE_EXPIRED = 4,
    BC_LEASE_REVOKED = 5
};

typedef struct bc_engine_config {
    int32_t dims;                   /* held dimensions, >= 1 */
    const int64_t *capacity;        /* [dims] whole units (each a slot), >= 0 */
    const int64_t *headroom;        /* [dims] units opportunistic leases leave free */
    const int64_t *price;           /* [dims] micro-credits per unit-hour, >= 0 */
    int32_t classes;                /* service classes, >= 1 */
    const int64_t *class_table;     /* [classes][6]: rank, multiplier (ppm), congestion
                                       priced (0/1), preemptible (0/1), preemption grace
                                       (ns), free when the budget is spent (0/1) */
    int32_t thresholds;             /* congestion thresholds, >= 0 */
    const int64_t *cong_thresholds; /* [thresholds] ppm, ascending (NULL when none) */
    const int64_t *cong_mult;       /* [thresholds + 1] multipliers, ppm */
    int64_t window_ns;              /* the congestion window, >= 1 */
    int32_t bins;                   /* its bins, >= 1 */
    int32_t instant;                /* 1: tokens enforced instantly; 0: prepaid */
    int64_t half_life_ns;           /* fair-share half-life, >= 1 */
    int64_t reuse_after;            /* an ended lease's row is reused after this many
                                       later ends; < 0: never (lease ids never repeat) */
} bc_engine_config;

/* A decision. */
typedef struct bc_decision {
    int32_t outcome;    /* BC_GRANTED, BC_REFUSED or BC_DEFERRED */
    int32_t reason;     /* BC_REASON_*: BC_REASON_NONE when granted */
    int64_t units;      /* units granted (0 when not granted) */
    int64_t lease;      /* the lease id when granted, else -1 */
    int64_t charge;     /* micro-credits charged (a renewal: its extension's) */
} bc_decision;

/* A lease as the engine holds it. */
typedef struct bc_lease_info {
    int64_t campaign;
    int32_t dim;
    int32_t cls;
    int64_t units;
    int32_t state;      /* BC_LEASE_* */
    int64_t granted_at, starts_at, ends_at;
    int64_t charge;     /* micro-credits charged so far (before any refund) */
} bc_lease_info;

/* A new engine (BC_EINVAL / BC_ERANGE on a bad configuration, naming nothing: check each
 * field's range above). Free it with bc_engine_free. */
int bc_engine_new(const bc_engine_config *config, bc_engine **out);
void bc_engine_free(bc_engine *e);

/* Registers a campaign at `now`: per dimension its guarantee, sustained rate and burst
 * ceiling (units) and its token bucket's size (unit·ns; it starts full); `credits` its
 * budget (micro-credits; BC_MAX_AMOUNT: none). Refused with BC_ERANGE unless
 * 0 <= guarantee <= sustained <= ceiling on every dimension, or when a guarantee would take
 * the sum of guarantees beyond a dimension's capacity. Its index to *index. */
int bc_engine_add_campaign(bc_engine *e, const int64_t *guaranteed, const int64_t *sustained,
                           const int64_t *ceiling, const int64_t *bucket, int64_t credits,
                           int64_t now, int64_t *index);

/* Registers a node of the tree of envelopes (docs/spec.md §14) at `now`: a child of node
 * `parent` (an index bc_engine_add_campaign or bc_engine_add_node gave), or a top-level
 * campaign when `parent` < 0; the other arguments as bc_engine_add_campaign's. Its
 * guarantees nest: refused with BC_ERANGE when, on a dimension, the guarantees of the
 * parent's children would exceed the parent's (of the top-level nodes: the capacity), or
 * when the guarantee does not fit the reserve now (capacity − Σ_top R + the slack of the
 * parent's path, §14.3) or would raise the load of a node on the parent's path above its
 * sustained rate (§14.1), or when the node would lie deeper than BC_TREE_DEPTH levels.
 * BC_EINDEX for a parent not registered. Its index to *index. A node's requests are
 * decided by every level of its path: the reserve rule of §14.3 for capacity, and the
 * ceiling, bucket and budget of the node and of each ancestor (§14.2). */
int bc_engine_add_node(bc_engine *e, int64_t parent, const int64_t *guaranteed,
                       const int64_t *sustained, const int64_t *ceiling,
                       const int64_t *bucket, int64_t credits, int64_t now, int64_t *index);

/* Changes the envelope of campaign `index` (docs/spec.md §14.9) at `now`, its arguments as
 * bc_engine_add_campaign's. Its live leases keep what they were granted; the new figures
 * bind later decisions. A bucket is settled, then clipped to its new size; the credits left
 * move by the change of the budget. Refused with BC_ERANGE, changing nothing, unless
 * 0 <= guarantee <= sustained <= ceiling on every dimension, the guarantees of its
 * children nest in its new guarantee and it with its siblings' in its parent's (of the
 * top-level nodes: in the capacity), a raise of a guarantee fits the reserve and the loads
 * of its parent's path now (as a new child of the parent guaranteed the raise would, see
 * bc_engine_add_node), the budget stays unlimited (BC_MAX_AMOUNT) or finite and leaves the
 * credits left at 0 or more. BC_EINDEX for an unregistered campaign. */
int bc_engine_change_node(bc_engine *e, int64_t index, const int64_t *guaranteed,
                          const int64_t *sustained, const int64_t *ceiling,
                          const int64_t *bucket, int64_t credits, int64_t now);

/* Borrowing (docs/spec.md §14.8) for campaign `index`, per dimension: borrow_limit, the most
 * units its borrowed leases may hold (0, a new campaign's: it never borrows), and
 * lend_limit, the most of its idle guarantee its siblings may borrow (a new campaign's:
 * no limit; any value above BC_MAX_AMOUNT means none). A request of a firm class that the
 * reserve cuts short is then granted, when that gives it more, a borrowed lease: free units
 * within its firm room plus what its siblings leave idle of their guarantees (each up to its
 * lend limit, less what is borrowed from them), revocable like an opportunistic lease when
 * the pool needs them back. BC_ERANGE for a negative limit or a borrow limit above
 * BC_MAX_AMOUNT; BC_EINDEX for an unregistered campaign. */
int bc_engine_set_borrowing(bc_engine *e, int64_t index, const int64_t *borrow_limit,
                            const int64_t *lend_limit);

/* Expires what is due by `now`, then decides a request of [min_units, max_units] units of
 * class `cls` on dimension `dim` for `duration` ns, spending at most `max_spend`
 * micro-credits (< 0: no cap); a warm grant is committed. `intent` is the caller's id for
 * the request, kept on the lease. */
int bc_engine_acquire(bc_engine *e, int64_t campaign, int32_t dim, int32_t cls,
                      int64_t min_units, int64_t max_units, int64_t duration,
                      int64_t max_spend, int64_t now, int64_t intent, bc_decision *out);

/* Expires what is due by `now`, then extends an active lease by `extend` ns (refused for
 * tokens or credits, with the lease unchanged). BC_EINDEX for an unknown or ended lease. */
int bc_engine_renew(bc_engine *e, int64_t lease, int64_t extend, int64_t max_spend,
                    int64_t now, bc_decision *out);

/* Ends a lease at `now`, refunding its unused time's tokens and credits. */
int bc_engine_release(bc_engine *e, int64_t lease, int64_t now);

/* Expires every lease due by `now`, in (end, id) order; up to `room` of their ids to
 * `expired` (may be NULL when room is 0) and how many expired to *count. Expiries beyond
 * `room` still happen. */
int bc_engine_advance(bc_engine *e, int64_t now, int64_t *expired, size_t room,
                      size_t *count);

/* A lease's record (ended leases stay readable until their row is reused). */
int bc_engine_lease(const bc_engine *e, int64_t lease, bc_lease_info *out);

/* A campaign's credits left (micro-credits; BC_MAX_AMOUNT for no budget) and, on one
 * dimension, its holding (units; a node of a tree's: its subtree's) and tokens (unit·ns), its bucket settled at `now` (never
 * before its last settlement: an earlier `now` reads it as it stands). */
int bc_engine_balance(bc_engine *e, int64_t campaign, int32_t dim, int64_t now,
                      int64_t *credits, int64_t *held, int64_t *tokens);

/* --- cdef end --- */

#ifdef __cplusplus
}
#endif

#endif /* BURSARCORE_H */
