/* learning_rate.c: the run-time scalar expressions and the learning rate of each step.
 *
 * replicas, workers and global_batch are known once the job has started; learning
 * rates and weight decay that depend on them were compiled as small stack programs
 * (ddp_rt_expr). Schedules count steps; a duration in epochs is converted with the
 * number of steps in an epoch. */
#include <math.h>

#include "runtime.h"

double ddp_rt_eval(const ddp_rt_expr *e, double replicas, double workers, double global_batch) {
    double stack[64];
    int top = 0;
    for (int64_t i = 0; i < e->count && top < 64; i++) {
        const ddp_rt_instr *in = &e->code[i];
        switch (in->op) {
        case DDP_RT_CONST: stack[top++] = in->value; break;
        case DDP_RT_REPLICAS: stack[top++] = replicas; break;
        case DDP_RT_WORKERS: stack[top++] = workers; break;
        case DDP_RT_GLOBAL_BATCH: stack[top++] = global_batch; break;
        case DDP_RT_NEG: stack[top - 1] = -stack[top - 1]; break;
        default: {
            double b = stack[--top], a = stack[--top];
            stack[top++] = in->op == DDP_RT_ADD ? a + b : in->op == DDP_RT_SUB ? a - b
                         : in->op == DDP_RT_MUL ? a * b : a / b;
        }
        }
    }
    return top ? stack[top - 1] : 0;
}

static int64_t steps_of(ddp_duration d, int64_t steps_per_epoch) {
    return d.unit == DDP_UNIT_EPOCHS ? d.value * steps_per_epoch : d.value;
}

/* multistep: the milestones at or before step, counted from the run's start. */
static int64_t milestones_passed(const ddp_schedule *s, int64_t step, int64_t steps_per_epoch) {
    int64_t n = 0;
    while (n < s->nmilestones &&
           step >= steps_of((ddp_duration){s->milestones[n], s->milestone_unit}, steps_per_epoch))
        n++;
    return n;
}

double ddp_learning_rate(const ddp_program *p, double rate_override, int64_t epochs, int64_t step,
                         int64_t steps_per_epoch, double replicas, double workers, double global_batch) {
    const ddp_schedule *s = &p->settings.optimizer.learning_rate;
    double rate = isnan(rate_override) ? ddp_rt_eval(&s->rate, replicas, workers, global_batch) : rate_override;
    if (s->kind == DDP_SCHEDULE_CONSTANT)
        return rate;
    int64_t warmup = steps_of(s->warmup, steps_per_epoch);
    if (step < warmup)
        return rate * (double)(step + 1) / (double)warmup;
    if (s->kind == DDP_SCHEDULE_STEP || s->kind == DDP_SCHEDULE_MULTISTEP) {
        double drop = ddp_rt_eval(&s->drop, replicas, workers, global_batch);
        int64_t period = steps_of(s->period, steps_per_epoch);
        int64_t drops = s->kind == DDP_SCHEDULE_MULTISTEP ? milestones_passed(s, step, steps_per_epoch)
                        : period > 0                      ? step / period
                                                          : 0;
        return rate * pow(drop, (double)drops);
    }
    double final = ddp_rt_eval(&s->final, replicas, workers, global_batch);
    int64_t total = epochs * steps_per_epoch;
    double progress = total > warmup ? (double)(step - warmup) / (double)(total - warmup) : 1;
    if (progress > 1)
        progress = 1;
    if (s->kind == DDP_SCHEDULE_COSINE)
        return final + (rate - final) * 0.5 * (1 + cos(M_PI * progress));
    return final + (rate - final) * (1 - progress);
}

void ddp_prepare_step(ddp_runtime *rt, int64_t step, int64_t steps_per_epoch) {
    const ddp_program *p = rt->program;
    double replicas = rt->replicas, workers = rt->workers;
    double global = (double)ddp_step_samples(p, rt->replicas); /* the run-time scalar */
    const ddp_optimizer *o = &p->settings.optimizer;
    rt->scalars[DDP_S_STEP].i = step;
    rt->scalars[DDP_S_LEARNING_RATE].f =
        rt->sweep_steps ? rt->sweep[0] * pow(rt->sweep[1] / rt->sweep[0], (double)step / (double)(rt->sweep_steps - 1))
                        : rt->rate_scale * ddp_learning_rate(p, rt->rate_override, rt->epochs, step, steps_per_epoch,
                                                             replicas, workers, global);
    rt->scalars[DDP_S_WEIGHT_DECAY].f = ddp_rt_eval(&o->weight_decay, replicas, workers, global);
    rt->scalars[DDP_S_BIAS_WEIGHT_DECAY].f = ddp_rt_eval(&o->bias_weight_decay, replicas, workers, global);
    rt->scalars[DDP_S_NORM_WEIGHT_DECAY].f = ddp_rt_eval(&o->norm_weight_decay, replicas, workers, global);
    rt->scalars[DDP_S_BIAS_CORRECTION1].f = 1 - pow(o->beta1, (double)(step + 1));
    rt->scalars[DDP_S_BIAS_CORRECTION2].f = 1 - pow(o->beta2, (double)(step + 1));
    double update = (double)(step + 1); /* TensorFlow's num_updates warm-up: (1 + n) / (10 + n) */
    double decay = o->ema_warmup && (1 + update) / (10 + update) < o->ema ? (1 + update) / (10 + update) : o->ema;
    rt->scalars[DDP_S_EMA_DECAY].f = decay;
    rt->scalars[DDP_S_EMA_REST].f = 1 - decay;
}
