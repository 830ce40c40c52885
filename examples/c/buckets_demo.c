/*
 * A C program using bursarcore's core through its C ABI: a table of token buckets (one
 * burst allowance per campaign), driven by a script of operations, one per line:
 *
 *   append CAPACITY RATE TOKENS NOW     (TOKENS -1: full)
 *   debit  I AMOUNT NOW
 *   refund I AMOUNT NOW
 *   rate   I RATE NOW
 *   until  I AMOUNT NOW
 *   peek   NOW
 *   batch  NOW I:AMOUNT I:AMOUNT ...     (one instant for the whole batch)
 *
 * Amounts, capacities and rates are fixed point (BC_SCALE per unit, rates per second);
 * times are nanoseconds. Each operation prints one line: the operation, its status and
 * its result. With no argument the program runs its own script (two campaigns); with "-"
 * it reads one from standard input.
 *
 *   make run          # build against the installed package and run the built-in script
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bursarcore.h"

static const char *DEMO =
    "append 10000000 1000000 -1 0\n"      /* campaign 0: 10 units, refills 1 unit/s */
    "append 4000000 500000 0 0\n"         /* campaign 1: 4 units, empty, 0.5 unit/s */
    "debit 0 3000000 1000000000\n"        /* 3 units at t = 1 s: granted */
    "debit 1 1000000 1000000000\n"        /* 1 unit at 1 s: only 0.5 there, refused */
    "until 1 1000000 1000000000\n"        /* when will campaign 1 have 1 unit? */
    "batch 2000000000 0:4000000 1:1000000 0:4000000\n"
    "refund 0 2500000 3000000000\n"
    "rate 1 2000000 3000000000\n"
    "peek 4000000000\n"
    "debit 0 1000000 500000000\n"         /* time went backwards: BC_ETIME, no change */
    "debit 7 1000000 5000000000\n";       /* no bucket 7: BC_EINDEX */

static const char *name(int st)
{
    switch (st) {
    case BC_OK: return "ok";
    case BC_EINVAL: return "EINVAL";
    case BC_ERANGE: return "ERANGE";
    case BC_EINDEX: return "EINDEX";
    case BC_ETIME: return "ETIME";
    case BC_ENOMEM: return "ENOMEM";
    case BC_ETOKENS: return "ETOKENS";
    default: return "?";
    }
}

static int run(bc_buckets *b, char *line)
{
    char op[16];
    long long x, y, z, t;
    int n = 0, st;
    if (sscanf(line, "%15s%n", op, &n) != 1)
        return 0;
    line += n;
    if (strcmp(op, "append") == 0 && sscanf(line, "%lld %lld %lld %lld", &x, &y, &z, &t) == 4) {
        size_t i = 0;
        st = bc_buckets_append(b, x, y, z, t, &i);
        printf("append -> %s", name(st));
        if (st == BC_OK)
            printf(" %zu", i);
    } else if (strcmp(op, "debit") == 0 && sscanf(line, "%lld %lld %lld", &x, &y, &t) == 3) {
        int granted = 0;
        st = bc_buckets_try_debit(b, (size_t)x, y, t, &granted);
        printf("debit -> %s", name(st));
        if (st == BC_OK)
            printf(" %d", granted);
    } else if (strcmp(op, "refund") == 0 && sscanf(line, "%lld %lld %lld", &x, &y, &t) == 3) {
        int64_t credited = 0;
        st = bc_buckets_refund(b, (size_t)x, y, t, &credited);
        printf("refund -> %s", name(st));
        if (st == BC_OK)
            printf(" %lld", (long long)credited);
    } else if (strcmp(op, "rate") == 0 && sscanf(line, "%lld %lld %lld", &x, &y, &t) == 3) {
        st = bc_buckets_set_rate(b, (size_t)x, y, t);
        printf("rate -> %s", name(st));
    } else if (strcmp(op, "until") == 0 && sscanf(line, "%lld %lld %lld", &x, &y, &t) == 3) {
        int64_t wait = 0;
        st = bc_buckets_time_until(b, (size_t)x, y, t, &wait);
        printf("until -> %s", name(st));
        if (st == BC_OK) {
            if (wait == BC_NEVER)
                printf(" never");
            else
                printf(" %lld", (long long)wait);
        }
    } else if (strcmp(op, "peek") == 0 && sscanf(line, "%lld", &t) == 1) {
        size_t k, len = bc_buckets_len(b);
        int64_t *tok = malloc((len ? len : 1) * sizeof *tok);
        if (tok == NULL)
            return -1;
        st = bc_buckets_peek(b, t, tok, len);
        printf("peek -> %s", name(st));
        for (k = 0; st == BC_OK && k < len; k++)
            printf(" %lld", (long long)tok[k]);
        free(tok);
    } else if (strcmp(op, "batch") == 0 && sscanf(line, "%lld%n", &t, &n) == 1) {
        int64_t idx[64], amount[64];
        uint8_t granted[64];
        int64_t when = t;
        size_t k, m = 0, bad = 0;
        line += n;
        while (m < 64 && sscanf(line, " %lld:%lld%n", &x, &y, &n) == 2) {
            idx[m] = x;
            amount[m++] = y;
            line += n;
        }
        st = bc_buckets_try_debit_batch(b, idx, m, amount, m, &when, 1, granted, &bad);
        printf("batch -> %s", name(st));
        for (k = 0; st == BC_OK && k < m; k++)
            printf(" %d", granted[k]);
        if (st != BC_OK)
            printf(" at %zu", bad);
    } else {
        fprintf(stderr, "buckets_demo: cannot read: %s %s", op, line);
        return -1;
    }
    printf("\n");
    return 0;
}

int main(int argc, char **argv)
{
    bc_buckets *b = NULL;
    char line[4096];
    int st;
    if (bc_abi_version() != BURSARCORE_ABI_VERSION) {
        fprintf(stderr, "buckets_demo: library ABI %d, built for %d\n", bc_abi_version(),
                BURSARCORE_ABI_VERSION);
        return 2;
    }
    st = bc_buckets_new(0, 0, &b);
    if (st != BC_OK) {
        fprintf(stderr, "buckets_demo: %s\n", bc_strerror(st));
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "-") == 0) {
        while (fgets(line, sizeof line, stdin) != NULL)
            if (run(b, line) != 0)
                return 1;
    } else {
        const char *p = DEMO;
        while (*p) {
            size_t len = strcspn(p, "\n");
            memcpy(line, p, len);
            line[len] = '\0';
            if (run(b, line) != 0)
                return 1;
            p += len + (p[len] == '\n');
        }
    }
    bc_buckets_free(b);
    return 0;
}
