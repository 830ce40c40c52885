/*
 * A toy broker in C over bursarcore's admission engine (its C ABI): one pool of 8 GPUs,
 * the Python Broker's default service classes and congestion table, campaigns with
 * envelopes, and leases acquired, renewed, released and expired. Driven by a script, one
 * operation per line:
 *
 *   campaign G S B BUCKET CREDITS NOW   (guarantee, sustained, ceiling in units; bucket in
 *                                        unit-ns; credits in micro-credits, -1: no budget)
 *   node P G S B BUCKET CREDITS NOW     (a child of campaign or node P in a tree of
 *                                        envelopes: every level of its path binds it)
 *   acquire  C CLASS MIN MAX DURATION NOW
 *   renew    LEASE EXTEND NOW
 *   release  LEASE NOW
 *   advance  NOW                         (prints the leases expired since the last one)
 *   balance  C                           (credits left, units held, tokens, now)
 *
 * Times are nanoseconds. Classes: 0 deadline, 1 interactive, 2 agent-burst,
 * 3 opportunistic. Each operation prints one line. A request the engine defers (a reclaim
 * or a pending wait: the policy layer's, which this toy broker does not have) is dropped.
 * With no argument the program runs its own script; with "-" it reads one from standard
 * input.
 *
 *   make run          # build against the installed package and run the built-in script
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bursarcore.h"

static const char *DEMO =
    "campaign 2 2 6 2000000000 100000000 0\n"  /* astro: 2 guaranteed, 100 credits */
    "campaign 1 3 4 0 1000000 0\n"             /* bio: no burst bucket, 1 credit */
    "acquire 0 2 1 4 60000000000 0\n"          /* astro 1..4 for 60 s: 2 (its rate) */
    "acquire 1 2 3 3 30000000000 0\n"          /* bio 3 for 30 s */
    "renew 0 30000000000 10000000000\n"        /* astro's lease 30 s longer */
    "acquire 1 2 5 5 30000000000 20000000000\n" /* bio 5: beyond its ceiling */
    "acquire 0 2 4 4 60000000000 20000000000\n" /* astro 4 more: beyond its tokens */
    "acquire 1 2 1 1 3600000000000 20000000000\n" /* bio 1 for an hour: beyond its credits */
    "balance 1\n"
    "release 1 25000000000\n"                  /* bio gives its 3 back at 25 s */
    "balance 1\n"
    "acquire 1 3 1 8 10000000000 30000000000\n" /* bio opportunistic: its rate, idle units */
    "advance 100000000000\n"                   /* everything has ended by 100 s */
    "balance 0\n"
    "node 0 1 4 4 0 -1 100000000000\n"        /* astro/lab: 1 of astro's 2, no budget */
    "acquire 2 2 1 4 60000000000 100000000000\n" /* 2: astro's rate above lab's 1 binds */
    "acquire 2 2 1 4 1000000000 100000000000\n" /* 2 more for 1 s: astro's bucket pays */
    "balance 0\n"                             /* astro holds its subtree's 4 */
    "release 4 100500000000\n"                /* half a second back to astro's bucket */
    "balance 0\n";

/* The Python Broker's defaults: classes (rank, multiplier ppm, congestion priced,
 * preemptible, grace ns, free when broke) and congestion (thresholds, multipliers). */
static const int64_t CLASSES[4][6] = {
    {0, 4000000, 1, 0, 0, 0},
    {1, 2000000, 1, 0, 0, 0},
    {2, 3000000, 1, 0, 0, 0},
    {3, 250000, 0, 1, 60000000000LL, 1},
};
static const int64_t THRESHOLDS[3] = {500000, 1000000, 2000000};
static const int64_t MULTIPLIERS[4] = {1000000, 1500000, 2250000, 3000000};

static const char *OUTCOMES[] = {"granted", "refused", "deferred"};
static const char *REASONS[] = {"none", "capacity", "tokens", "credits", "ceiling"};
static const char *STATES[] = {"starting", "active", "revoking", "released", "expired",
                               "revoked"};

static int64_t expired[4096];
static int64_t now;              /* the time of the last operation */
static size_t n_expired;

static int status(const char *what, int st)
{
    if (st != BC_OK)
        printf("%s: %s\n", what, bc_strerror(st));
    return st;
}

/* Expire what is due by `now`, keeping the ids for the next `advance` line. */
static int expire(bc_engine *e, int64_t t)
{
    size_t n = 0;
    int st;
    now = t;
    st = bc_engine_advance(e, t, expired + n_expired,
                               sizeof(expired) / sizeof(expired[0]) - n_expired, &n);
    if (st == BC_OK)
        n_expired += n;
    return st;
}

static void decision(const char *line, const bc_decision *d)
{
    printf("%s: %s units=%lld reason=%s lease=%lld charge=%lld\n", line,
           OUTCOMES[d->outcome], (long long)d->units, REASONS[d->reason], (long long)d->lease,
           (long long)d->charge);
}

static void run(bc_engine *e, char *line)
{
    char op[16];
    long long a[7];
    int n = sscanf(line, "%15s %lld %lld %lld %lld %lld %lld %lld", op, &a[0], &a[1], &a[2],
                   &a[3], &a[4], &a[5], &a[6]);
    bc_decision d;
    bc_lease_info l;
    int64_t idx, g, s, b, bucket, credits, held, tokens;
    size_t k;
    line[strcspn(line, "\n")] = 0;
    if (n < 1)
        return;
    if (strcmp(op, "campaign") == 0 && n == 7) {
        g = a[0], s = a[1], b = a[2], bucket = a[3];
        credits = a[4] < 0 ? BC_MAX_AMOUNT : a[4];
        if (status(line, bc_engine_add_campaign(e, &g, &s, &b, &bucket, credits, a[5], &idx)) == BC_OK)
            printf("%s: campaign %lld\n", line, (long long)idx);
    } else if (strcmp(op, "node") == 0 && n == 8) {
        g = a[1], s = a[2], b = a[3], bucket = a[4];
        credits = a[5] < 0 ? BC_MAX_AMOUNT : a[5];
        if (status(line, bc_engine_add_node(e, a[0], &g, &s, &b, &bucket, credits, a[6],
                                            &idx)) == BC_OK)
            printf("%s: node %lld\n", line, (long long)idx);
    } else if (strcmp(op, "acquire") == 0 && n == 7) {
        if (status(line, expire(e, a[5])) != BC_OK)
            return;
        if (status(line, bc_engine_acquire(e, a[0], 0, (int32_t)a[1], a[2], a[3], a[4], -1,
                                           a[5], 0, &d)) == BC_OK)
            decision(line, &d);
    } else if (strcmp(op, "renew") == 0 && n == 4) {
        if (status(line, expire(e, a[2])) != BC_OK)
            return;
        if (status(line, bc_engine_renew(e, a[0], a[1], -1, a[2], &d)) == BC_OK)
            decision(line, &d);
    } else if (strcmp(op, "release") == 0 && n == 3) {
        if (status(line, expire(e, a[1])) != BC_OK)
            return;
        if (status(line, bc_engine_release(e, a[0], a[1])) == BC_OK
                && bc_engine_lease(e, a[0], &l) == BC_OK)
            printf("%s: %s units=%lld charge=%lld\n", line, STATES[l.state],
                   (long long)l.units, (long long)l.charge);
    } else if (strcmp(op, "advance") == 0 && n == 2) {
        if (status(line, expire(e, a[0])) != BC_OK)
            return;
        printf("%s: expired", line);
        for (k = 0; k < n_expired; k++)
            printf(" %lld", (long long)expired[k]);
        printf("\n");
        n_expired = 0;
    } else if (strcmp(op, "balance") == 0 && n == 2) {
        if (status(line, bc_engine_balance(e, a[0], 0, now, &credits, &held, &tokens)) == BC_OK)
            printf("%s: credits=%lld held=%lld tokens=%lld\n", line, (long long)credits,
                   (long long)held, (long long)tokens);
    } else {
        printf("%s: not an operation\n", line);
    }
}

int main(int argc, char **argv)
{
    static const int64_t capacity[1] = {8}, headroom[1] = {0}, price[1] = {1000000};
    bc_engine_config config = {
        1, capacity, headroom, price, 4, &CLASSES[0][0], 3, THRESHOLDS, MULTIPLIERS,
        60000000000LL, 60, 0, 600000000000LL, 1024,
    };
    bc_engine *e;
    char line[512];
    const char *p, *q;
    if (bc_abi_version() != BURSARCORE_ABI_VERSION) {
        fprintf(stderr, "libbursarcore ABI %d, this program was built for %d\n",
                bc_abi_version(), BURSARCORE_ABI_VERSION);
        return 2;
    }
    if (status("new", bc_engine_new(&config, &e)) != BC_OK)
        return 1;
    if (argc > 1 && strcmp(argv[1], "-") == 0) {
        while (fgets(line, sizeof(line), stdin) != NULL)
            run(e, line);
    } else {
        for (p = DEMO; *p; p = q + 1) {
            q = strchr(p, '\n');
            memcpy(line, p, (size_t)(q - p));
            line[q - p] = 0;
            run(e, line);
        }
    }
    bc_engine_free(e);
    return 0;
}
