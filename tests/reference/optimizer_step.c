/* optimizer_step.c: the generated optimizer against its formulas, in f64.
 *
 * Three steps of the linked model; before each optimizer phase the parameters and
 * the summed gradients are copied, and the update is computed here from the program's
 * settings (learning rate, momentum, Nesterov, betas, epsilon, weight decay inside the
 * optimizer, clip_norm's scale), keeping this test's own momentum and moment vectors. Every parameter
 * must agree to 1e-12 relative. Each parameter takes its group's weight decay, the
 * group told here from its name (a batchnorm layer's: the normalisations'; another
 * vector: a bias) and held against the program's table. lars is SGD with each
 * parameter's step scaled by its trust ratio, computed here from its norm and its
 * gradient's as timm's Lars does; lamb is adamw with each parameter's step scaled by
 * its norm / the step's, as timm's Lamb does. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

/* The weight decay of every parameter element, from its group's scalar. */
static bool element_decays(ddp_runtime *rt, double *decay) {
    const ddp_program *p = rt->program;
    for (int64_t k = 0; k < p->nparams; k++) {
        const ddp_param *q = &p->params[k];
        if (q->region != DDP_REGION_PARAMS)
            continue;
        int group = strstr(q->name, ".batchnorm") ? DDP_DECAY_NORMS : q->rank == 1 ? DDP_DECAY_BIASES
                                                                                   : DDP_DECAY_WEIGHTS;
        if (q->decay != group) {
            fprintf(stderr, "optimizer_step: %s is in decay group %lld, not %d\n", q->name, (long long)q->decay, group);
            return false;
        }
        static const int slots[] = {[DDP_DECAY_WEIGHTS] = DDP_S_WEIGHT_DECAY, [DDP_DECAY_BIASES] = DDP_S_BIAS_WEIGHT_DECAY,
                                    [DDP_DECAY_NORMS] = DDP_S_NORM_WEIGHT_DECAY};
        for (int64_t e = 0; e < q->count; e++)
            decay[q->offset + e] = rt->scalars[slots[group]].f;
    }
    return true;
}

/* lars and lamb: each element's scale, its parameter's trust ratio, where wd, |w| and |u|
 * are nonzero, else 1: timm's Lars trust_coefficient |w| / (|u| + wd |w| + epsilon), u
 * the gradient; timm's Lamb |w| / |u|, u the Adam step. */
static void trust_ratios(const ddp_program *p, const double *w, const double *g, const double *decay, double *trust) {
    const ddp_optimizer *opt = &p->settings.optimizer;
    for (int64_t k = 0; k < p->nparams; k++) {
        const ddp_param *q = &p->params[k];
        if (q->region != DDP_REGION_PARAMS)
            continue;
        double w2 = 0, g2 = 0, wd = decay[q->offset];
        for (int64_t e = q->offset; e < q->offset + q->count; e++)
            w2 += w[e] * w[e], g2 += g[e] * g[e];
        double wn = sqrt(w2), gn = sqrt(g2), ratio = 1;
        if (opt->kind == DDP_OPT_LARS && wd != 0 && wn > 0 && gn > 0)
            ratio = opt->trust_coefficient * wn / (gn + wd * wn + opt->epsilon);
        if (opt->kind == DDP_OPT_LAMB && wd != 0 && wn > 0 && gn > 0)
            ratio = wn / gn;
        for (int64_t e = q->offset; e < q->offset + q->count; e++)
            trust[e] = ratio;
    }
}

int main(void) {
    const ddp_program *p = &ddp_program_desc;
    ddp_options o = {.threads = 1};
    char err[256];
    ddp_runtime *rt = ddp_open(p, &o, err, sizeof err);
    if (!rt || p->dtype != DDP_F64) {
        fprintf(stderr, "optimizer_step: %s\n", rt ? "build the model with --dtype f64" : err);
        return 2;
    }
    ddp_init_params(rt, 4);
    int64_t n = p->param_count, batch = p->settings.batch_per_replica, per = 1;
    for (int d = 0; d < p->input_rank; d++)
        per *= p->input_shape[d];
    double *x = ddp_buffer_ptr(rt, p->input_slot);
    for (int64_t i = 0; i < batch * per; i++)
        x[i] = cos(0.7 * (double)i);
    for (int64_t s = 0; s < batch; s++)
        ((int32_t *)ddp_buffer_ptr(rt, p->label_slot))[s] = (int32_t)(s % p->output_elems);
    ddp_set_batch(rt, batch, batch);
    double *params = rt->region[DDP_REGION_PARAMS], *grads = rt->region[DDP_REGION_GRADS];
    double *before = calloc((size_t)n, 8), *m = calloc((size_t)n, 8), *v = calloc((size_t)n, 8);
    double *decay = calloc((size_t)n, 8), *trust = calloc((size_t)n, 8), *steps = calloc((size_t)n, 8);
    const ddp_optimizer *opt = &p->settings.optimizer;
    double worst = 0;
    for (int step = 0; step < 3; step++) {
        ddp_prepare_step(rt, step, 10);
        ddp_run_phase(rt, DDP_PHASE_FORWARD);
        ddp_run_phase(rt, DDP_PHASE_BACKWARD);
        memcpy(before, params, (size_t)n * 8);
        ddp_run_phase(rt, DDP_PHASE_OPTIMIZER);
        double lr = rt->scalars[DDP_S_LEARNING_RATE].f;
        if (!element_decays(rt, decay))
            return 1;
        double squares = 0, scale = 1; /* clip_norm: the gradients scaled to it, as PyTorch's clip_grad_norm_ */
        for (int64_t i = 0; i < n; i++)
            squares += grads[i] * grads[i];
        if (opt->clip_norm > 0 && opt->clip_norm / (sqrt(squares) + 1e-6) < 1)
            scale = opt->clip_norm / (sqrt(squares) + 1e-6);
        for (int64_t i = 0; i < n; i++)
            grads[i] *= scale;
        bool sgd = opt->kind == DDP_OPT_SGD || opt->kind == DDP_OPT_LARS;
        for (int64_t i = 0; !sgd && i < n; i++) { /* Adam's steps, before lamb's ratios of them */
            double w = before[i], g = grads[i], wd = decay[i];
            double gw = opt->kind == DDP_OPT_ADAM ? g + wd * w : g;
            m[i] = opt->beta1 * m[i] + (1 - opt->beta1) * gw;
            v[i] = opt->beta2 * v[i] + (1 - opt->beta2) * gw * gw;
            double mhat = m[i] / (1 - pow(opt->beta1, step + 1)), vhat = v[i] / (1 - pow(opt->beta2, step + 1));
            steps[i] = mhat / (sqrt(vhat) + opt->epsilon) + (opt->kind == DDP_OPT_ADAM ? 0 : wd * w);
        }
        trust_ratios(p, before, sgd ? grads : steps, decay, trust);
        for (int64_t i = 0; i < n; i++) {
            double w = before[i], g = grads[i], wd = decay[i], update = steps[i] * trust[i];
            if (sgd) {
                double gw = (g + wd * w) * trust[i];
                update = gw;
                if (opt->state_vectors) {
                    m[i] = opt->momentum * m[i] + gw;
                    update = opt->nesterov ? gw + opt->momentum * m[i] : m[i];
                }
            }
            double expect = w - lr * update;
            double e = fabs(params[i] - expect) / fmax(fabs(expect), 1e-12);
            if (e > worst)
                worst = e;
        }
    }
    static const char *const names[] = {"sgd", "adam", "adamw", "lars", "lamb"};
    bool ok = worst <= 1e-12;
    printf("optimizer_step %s%s, weight decays %g, biases %g, normalisations %g: largest relative difference %.2e "
           "over 3 steps: %s\n", names[opt->kind],
           opt->state_vectors && (opt->kind == DDP_OPT_SGD || opt->kind == DDP_OPT_LARS)
               ? (opt->nesterov ? " (nesterov)" : " (momentum)") : "",
           rt->scalars[DDP_S_WEIGHT_DECAY].f, rt->scalars[DDP_S_BIAS_WEIGHT_DECAY].f,
           rt->scalars[DDP_S_NORM_WEIGHT_DECAY].f, worst, ok ? "ok" : "FAIL");
    free(decay);
    free(trust);
    free(steps);
    free(before);
    free(m);
    free(v);
    ddp_close(rt);
    return ok ? 0 : 1;
}
