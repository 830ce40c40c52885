/*
 * One token bucket's arithmetic (docs/spec.md §3), written once. Internal to the core:
 * the bucket table (buckets.c) and the flow-dimension engine call these, and the
 * compiler inlines them into each caller's loop.
 *
 * A bucket is four int64 in a row: size (capacity), rate (fixed point per second),
 * tokens, and the remainder of rate * dt not yet a whole fixed-point token (in
 * fixed-point nanoseconds, [0, BC_NS)). The time of the last settlement is kept by the
 * caller, who passes the elapsed dt.
 *
 * Exactness: tokens + rate * dt / BC_NS is computed without rounding (128-bit products
 * where 64 bits may overflow), so settling at t1 then t2 gives what settling at t2 gives.
 * A full bucket holds no remainder.
 */
#ifndef BURSARCORE_BUCKET_H
#define BURSARCORE_BUCKET_H

#include <stdint.h>

#include "bursarcore.h"
#include "ints.h"

#define BC_B_SIZE 0
#define BC_B_RATE 1
#define BC_B_TOK 2
#define BC_B_REM 3

/* Refill by dt > 0 ns. */
static inline void bc_bucket_settle(int64_t *b, bc_i128 dt)
{
    int64_t tok = b[BC_B_TOK], rate = b[BC_B_RATE], size = b[BC_B_SIZE], g64;
    bc_i128 gained;
    if (tok >= size) {
        b[BC_B_TOK] = size;
        b[BC_B_REM] = 0;
        return;
    }
    if (rate == 0)
        return;
    /* the common case in 64 bits: rate * dt + rem fits */
    if (dt <= INT64_MAX && !__builtin_mul_overflow(rate, (int64_t)dt, &g64)
            && g64 <= INT64_MAX - b[BC_B_REM]) {
        g64 += b[BC_B_REM];
        if (g64 / BC_NS >= size - tok) {         /* gained >= (size - tok) * BC_NS */
            b[BC_B_TOK] = size;
            b[BC_B_REM] = 0;
        } else {
            b[BC_B_TOK] = tok + g64 / BC_NS;
            b[BC_B_REM] = g64 % BC_NS;
        }
        return;
    }
    gained = (bc_i128)rate * dt + b[BC_B_REM];
    if (gained >= (bc_i128)(size - tok) * BC_NS) {
        b[BC_B_TOK] = size;
        b[BC_B_REM] = 0;
    } else {
        b[BC_B_TOK] = tok + (int64_t)(gained / BC_NS);
        b[BC_B_REM] = (int64_t)(gained % BC_NS);
    }
}

/* Tokens dt >= 0 ns after the last settlement, without settling. */
static inline int64_t bc_bucket_level(const int64_t *b, bc_i128 dt)
{
    int64_t tmp[4] = {b[0], b[1], b[2], b[3]};
    if (dt > 0)
        bc_bucket_settle(tmp, dt);
    else if (tmp[BC_B_TOK] >= tmp[BC_B_SIZE])
        return tmp[BC_B_SIZE];
    return tmp[BC_B_TOK];
}

/* The smallest dt >= 0 after which the bucket holds v tokens; BC_NEVER when v exceeds
 * the size, the rate is 0, or the wait exceeds BC_MAX_TIME ns (146 years). */
static inline int64_t bc_bucket_wait(const int64_t *b, int64_t v)
{
    int64_t tok = b[BC_B_TOK], rate = b[BC_B_RATE], q;
    bc_i128 need, q128;
    if (v <= tok)
        return 0;
    if (v > b[BC_B_SIZE] || rate == 0)
        return BC_NEVER;
    if (v - tok <= INT64_MAX / BC_NS) {       /* (v - tok) * BC_NS fits in int64 */
        q = (v - tok) * BC_NS - b[BC_B_REM];
        q = (q - 1) / rate + 1;                /* q > 0: ceil(q / rate) */
        return q > BC_MAX_TIME ? BC_NEVER : q;
    }
    need = (bc_i128)(v - tok) * BC_NS - b[BC_B_REM];
    q128 = (need - 1) / rate + 1;
    return q128 > BC_MAX_TIME ? BC_NEVER : (int64_t)q128;
}

/* Credits up to `amount` (never beyond the size); returns what was credited. The caller
 * settled the bucket first. */
static inline int64_t bc_bucket_refund(int64_t *b, int64_t amount)
{
    int64_t room = b[BC_B_SIZE] - b[BC_B_TOK];
    int64_t credited = amount < room ? amount : room;
    b[BC_B_TOK] += credited;
    if (b[BC_B_TOK] == b[BC_B_SIZE])
        b[BC_B_REM] = 0;
    return credited;
}

#endif /* BURSARCORE_BUCKET_H */
