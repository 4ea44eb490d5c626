/* gradcheck.c: the generated backward pass against central differences, in f64.
 *
 * Linked with one model built by `ddpc build --dtype f64 -c`. For a batch of random
 * inputs and labels and random initial parameters, each parameter tensor in turn gets
 * a random direction v (zero elsewhere); the directional derivative of the loss from
 * the generated gradient, g . v, must match (L(p + h v) - L(p - h v)) / 2h. Dropout
 * draws the same masks in every evaluation (same seed and step), batch normalisation
 * uses the batch's statistics in all of them. Prints one line per tensor and a
 * verdict; exits 1 on any mismatch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

static const double H = 1e-6, TOLERANCE = 1e-5;

static double loss_now(ddp_runtime *rt) {
    ddp_zero_accumulators(rt);
    ddp_run_phase(rt, DDP_PHASE_FORWARD);
    double n;
    double sum = ddp_accumulator(rt, 0, &n);
    return sum / (double)rt->scalars[DDP_S_GLOBAL_BATCH].i;
}

static double normal(uint64_t seed, uint32_t stream, uint64_t i) {
    uint32_t w[4];
    ddp_draw(seed, stream, i, 0, 0, w);
    uint32_t v[4] = {w[2], w[3], 0, 0};
    return sqrt(-2 * log(1 - ddp_uniform53(w))) * cos(2 * M_PI * ddp_uniform53(v));
}

/* A whole number in [0, n), from a normal draw of the stream. */
static int64_t draw_below(uint32_t stream, uint64_t i, int64_t n) {
    return (int64_t)((uint64_t)(normal(7, stream, i) * 1e6 + 1e9) % (uint64_t)n);
}

static void random_batch(ddp_runtime *rt, int64_t batch) {
    const ddp_program *p = rt->program;
    int64_t per = 1;
    for (int d = 0; d < p->input_rank; d++)
        per *= p->input_shape[d];
    double *x = ddp_buffer_ptr(rt, p->input_slot);
    for (int64_t i = 0; i < batch * per; i++) /* token indices where an embedding reads them */
        x[i] = p->input_vocab ? (double)draw_below(1, (uint64_t)i, p->input_vocab) : normal(7, 1, (uint64_t)i);
    /* rows of k classes: one a sample, or one a position of a [tokens, classes] output */
    int64_t rows = batch * p->label_positions, k = p->output_elems / p->label_positions;
    if (p->label_dtype == DDP_I32) {
        int32_t *y = ddp_buffer_ptr(rt, p->label_slot);
        for (int64_t r = 0; r < rows; r++)
            y[r] = (int32_t)draw_below(2, (uint64_t)r, k);
    } else {
        double *y = ddp_buffer_ptr(rt, p->label_slot);
        for (int64_t r = 0; r < rows; r++) {
            double total = 0;
            for (int64_t j = 0; j < k; j++) {
                double u = fabs(normal(7, 3, (uint64_t)(r * k + j)));
                /* targets in (0, 1): one-hot-like rows for categorical losses, values
                 * for the others */
                y[r * k + j] = p->settings.loss == DDP_LOSS_MSE ? normal(7, 4, (uint64_t)(r * k + j))
                               : u / (1 + u);
                total += y[r * k + j];
            }
            if (p->settings.loss == DDP_LOSS_CATEGORICAL)
                for (int64_t j = 0; j < k; j++)
                    y[r * k + j] /= total;
        }
    }
    int64_t *ids = ddp_buffer_ptr(rt, p->sample_id_slot);
    for (int64_t s = 0; s < batch; s++)
        ids[s] = 1000 + s;
}

int main(int argc, char **argv) {
    const ddp_program *p = &ddp_program_desc;
    int64_t batch = p->settings.batch_per_replica;
    if (argc > 1)
        batch = atoll(argv[1]); /* a smaller live batch than the planned one */
    if (p->dtype != DDP_F64) {
        fprintf(stderr, "gradcheck: build the model with --dtype f64\n");
        return 2;
    }
    ddp_options o = {.threads = 1};
    char err[256];
    ddp_runtime *rt = ddp_open(p, &o, err, sizeof err);
    if (!rt) {
        fprintf(stderr, "gradcheck: %s\n", err);
        return 2;
    }
    ddp_init_params(rt, 3);
    /* biases and batchnorm shifts away from their symmetric initial values */
    double *params = rt->region[DDP_REGION_PARAMS];
    for (int64_t i = 0; i < p->param_count; i++)
        params[i] += 0.1 * normal(11, 5, (uint64_t)i);
    ddp_set_batch(rt, batch, batch);
    random_batch(rt, batch);
    rt->scalars[DDP_S_STEP].i = 5;

    ddp_zero_accumulators(rt);
    ddp_run_phase(rt, DDP_PHASE_FORWARD);
    ddp_run_phase(rt, DDP_PHASE_BACKWARD);
    double *grads = rt->region[DDP_REGION_GRADS];
    double *g = malloc(sizeof(double) * (size_t)p->param_count);
    memcpy(g, grads, sizeof(double) * (size_t)p->param_count);
    double base = loss_now(rt);
    int failures = 0, checked = 0;
    printf("%s: loss %.12g, batch %lld of %lld, %lld parameters\n", p->name, base, (long long)batch,
           (long long)p->settings.batch_per_replica, (long long)p->param_count);
    for (int64_t t = 0; t < p->nparams; t++) {
        const ddp_param *prm = &p->params[t];
        if (prm->region != DDP_REGION_PARAMS)
            continue;
        double *v = calloc((size_t)prm->count, sizeof(double));
        double norm = 0, analytic = 0;
        for (int64_t e = 0; e < prm->count; e++) {
            v[e] = normal(13, (uint32_t)t, (uint64_t)e);
            norm += v[e] * v[e];
        }
        norm = sqrt(norm);
        for (int64_t e = 0; e < prm->count; e++) {
            v[e] /= norm;
            analytic += g[prm->offset + e] * v[e];
        }
        for (int64_t e = 0; e < prm->count; e++)
            params[prm->offset + e] += H * v[e];
        double plus = loss_now(rt);
        for (int64_t e = 0; e < prm->count; e++)
            params[prm->offset + e] -= 2 * H * v[e];
        double minus = loss_now(rt);
        for (int64_t e = 0; e < prm->count; e++)
            params[prm->offset + e] += H * v[e];
        double numeric = (plus - minus) / (2 * H);
        /* relative, except near zero, where rounding in the difference (about
         * 1e-16 |L| / H) sets the floor */
        double scale = fmax(fmax(fabs(numeric), fabs(analytic)), 1e-3);
        double error = fabs(numeric - analytic) / scale;
        bool ok = error <= TOLERANCE && isfinite(numeric) && isfinite(analytic);
        printf("  %-4s %-60s analytic %+.10e numeric %+.10e  error %.1e\n", ok ? "ok" : "FAIL", prm->name,
               analytic, numeric, error);
        failures += !ok;
        checked++;
        free(v);
    }
    printf("gradcheck %s: %s (%d of %d tensors)\n", p->name, failures ? "FAIL" : "ok", checked - failures, checked);
    free(g);
    ddp_close(rt);
    return failures ? 1 : 0;
}
