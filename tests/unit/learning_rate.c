/* learning_rate.c: every schedule's rate, step by step, against its formula written
 * out here: the warm-up from 0 (rate (t + 1) / warmup), step's drop every period,
 * multistep's at each milestone (in epochs or steps, counted from the run's start),
 * cosine's and linear's decay after the warm-up, and an expression of replicas. */
#include <math.h>
#include <stdio.h>

#include "check.h"
#include "runtime.h"

static const ddp_rt_instr rate_code[] = {{DDP_RT_CONST, 0.4}}, half_code[] = {{DDP_RT_CONST, 0.5}},
                          zero_code[] = {{DDP_RT_CONST, 0}},
                          per_replica_code[] = {{DDP_RT_CONST, 0.1}, {DDP_RT_REPLICAS, 0}, {DDP_RT_MUL, 0}};
static const ddp_rt_expr rate = {rate_code, 1}, half = {half_code, 1}, zero = {zero_code, 1},
                         per_replica = {per_replica_code, 3};

/* The largest difference from `want` over steps [0, n), 4 steps an epoch, 3 epochs, 2 replicas. */
static double worst(ddp_schedule s, double (*want)(int64_t), int64_t n) {
    ddp_program p = {0};
    p.settings.optimizer.learning_rate = s;
    double most = 0;
    for (int64_t t = 0; t < n; t++) {
        double got = ddp_learning_rate(&p, NAN, 3, t, 4, 2, 2, 128), d = fabs(got - want(t));
        if (!(d <= most))
            most = isnan(d) ? INFINITY : d;
        if (d > 1e-15)
            fprintf(stderr, "step %lld: %.17g, not %.17g\n", (long long)t, got, want(t));
    }
    return most;
}

static double constant(int64_t t) {
    (void)t;
    return 0.2; /* 0.1 * replicas */
}

/* step(0.4, drop = 0.5, every = 3 steps, warmup = 2 steps) */
static double stepped(int64_t t) {
    return t < 2 ? 0.4 * (double)(t + 1) / 2 : 0.4 * pow(0.5, (double)(t / 3));
}

/* multistep(0.4, milestones = [2 epochs, 3 epochs], drop = 0.5, warmup = 1 epochs) */
static double at_epochs(int64_t t) {
    return t < 4 ? 0.4 * (double)(t + 1) / 4 : t < 8 ? 0.4 : t < 12 ? 0.2 : 0.1;
}

/* multistep(0.4, milestones = [1 steps, 5 steps, 6 steps]): no warm-up */
static double at_steps(int64_t t) {
    return t < 1 ? 0.4 : t < 5 ? 0.2 : t < 6 ? 0.1 : 0.05;
}

/* cosine(0.4, warmup = 2 steps, final = 0.5): 12 steps in all, 10 after the warm-up */
static double cosine(int64_t t) {
    return t < 2 ? 0.4 * (double)(t + 1) / 2 : 0.5 + (0.4 - 0.5) * 0.5 * (1 + cos(M_PI * (double)(t - 2) / 10));
}

/* linear(0.4, warmup = 1 epochs, final = 0) */
static double linear(int64_t t) {
    return t < 4 ? 0.4 * (double)(t + 1) / 4 : 0.4 * (1 - (double)(t - 4) / 8);
}

int main(void) {
    const ddp_duration none = {0, 0}, two_steps = {2, DDP_UNIT_STEPS}, one_epoch = {1, DDP_UNIT_EPOCHS};
    static const int64_t epochs[] = {2, 3}, steps[] = {1, 5, 6};
    CHECK(worst((ddp_schedule){DDP_SCHEDULE_CONSTANT, per_replica, zero, zero, none, none, NULL, 0, 0},
                constant, 12) == 0);
    CHECK(worst((ddp_schedule){DDP_SCHEDULE_STEP, rate, half, zero, {3, DDP_UNIT_STEPS}, two_steps, NULL, 0, 0},
                stepped, 12) == 0);
    CHECK(worst((ddp_schedule){DDP_SCHEDULE_MULTISTEP, rate, half, zero, none, one_epoch, epochs, 2,
                               DDP_UNIT_EPOCHS}, at_epochs, 14) == 0);
    CHECK(worst((ddp_schedule){DDP_SCHEDULE_MULTISTEP, rate, half, zero, none, none, steps, 3, DDP_UNIT_STEPS},
                at_steps, 12) == 0);
    CHECK(worst((ddp_schedule){DDP_SCHEDULE_COSINE, rate, zero, half, none, two_steps, NULL, 0, 0}, cosine, 12) <=
          1e-15);
    CHECK(worst((ddp_schedule){DDP_SCHEDULE_LINEAR, rate, zero, zero, none, one_epoch, NULL, 0, 0}, linear, 12) <=
          1e-15);
    if (failures) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("learning_rate: constant, step, multistep (epochs, steps), cosine and linear, warm-ups included: ok\n");
    return 0;
}
