/* evaluate.h: the held-out evaluation (mean loss over a fixed token set, and the argmax predictions for
 * Top-1 agreement) and sampling, both on rank 0, and the -steps 0 run that does only these. */
#ifndef TSDC_EVALUATE_H
#define TSDC_EVALUATE_H

#include "run.h"

/* evaluation on the fixed held-out set: the first n_seq*T+1 tokens of -val, B sequences a pass.
 * Returns the mean loss; writes the argmax predictions when pred_path is set. Rank 0 only. */
static double evaluate(Run* run, const char* pred_path) {
    Model* model = &run->model;
    int B = model->B, T = model->T, V = model->c.vocab_size;
    long long n_seq = run->a.eval_tokens / T;
    if (n_seq < 1) n_seq = 1;
    if ((uint64_t)n_seq * T + 1 > run->val.n) n_seq = (long long)((run->val.n - 1) / T);
    int* preds = pred_path ? (int*)mallocCheck(sizeof(int) * n_seq * T) : NULL;
    int *inp = (int*)mallocCheck(sizeof(int) * B * T), *tgt = (int*)mallocCheck(sizeof(int) * B * T);
    float* losses = (float*)mallocCheck(sizeof(float) * B * T);
    double sum = 0.0; long long cnt = 0;
    for (long long s0 = 0; s0 < n_seq; s0 += B) {
        int nb = (int)(n_seq - s0 < B ? n_seq - s0 : B);
        for (int j = 0; j < B; j++) {
            if (j < nb) shard_sequence(&run->val, (uint64_t)(s0 + j) * T, T, inp + j * T, tgt + j * T);
            else for (int t = 0; t < T; t++) inp[j * T + t] = 0, tgt[j * T + t] = -1;
        }
        model_set_tokens(model, inp, tgt, B * T);
        model_forward_step(model, B, T, 1);
        model_token_losses(model, nb * T, losses);
        for (int n = 0; n < nb * T; n++) { sum += losses[n]; cnt++; }
        if (preds) model_argmax(model, nb * T, preds + s0 * T);
    }
    free(inp); free(tgt); free(losses);
    if (preds) {
        /* a token shard (docs/formats.md), 4-byte ids, so tsdc_io.read_shard reads it */
        OutFile f;
        outfile_open(&f, pred_path);
        uint8_t h[SHARD_HEADER_BYTES] = {0};
        memcpy(h, "TSDCTOK\0", 8);
        uint32_t ver = 1, width = 4, vocab = (uint32_t)V; uint64_t n = (uint64_t)n_seq * T;
        uint64_t chk = tsdc_checksum(preds, n * 4);
        memcpy(h + 8, &ver, 4); memcpy(h + 12, &width, 4); memcpy(h + 16, &vocab, 4); memcpy(h + 24, &n, 8); memcpy(h + 32, &chk, 8);
        outfile_write(&f, h, sizeof(h));
        outfile_write(&f, preds, n * 4);
        outfile_commit(&f);
        free(preds);
    }
    return sum / (double)cnt;
}

/* print a sample continuing from the first token of -val (or BOS): rank 0 only */
static void sample(Run* run) {
    Model* model = &run->model;
    int T = model->T, V = model->c.vocab_size, len = run->a.sample_len;
    int start = run->have_tok && run->tok.bos != 0xFFFFFFFFu ? (int)run->tok.bos
              : (run->have_val ? (int)shard_token(&run->val, 0) : 0);
    int* ctx = (int*)mallocCheck(sizeof(int) * (len + 1));
    float* z = (float*)mallocCheck(sizeof(float) * V);
    ctx[0] = start;
    printf("sample: ");
    if (run->have_tok) tokenizer_print(&run->tok, start, stdout);
    for (int i = 1; i <= len; i++) {
        int lo = i > T ? i - T : 0, n = i - lo;
        model_set_tokens(model, ctx + lo, NULL, n);
        model_forward_step(model, 1, n, 0);
        model_logits_row(model, n - 1, z);
        int next = 0;
        if (run->a.temperature <= 0) { for (int k = 1; k < V; k++) if (z[k] > z[next]) next = k; }
        else {
            double mx = -INFINITY, s = 0.0;
            for (int k = 0; k < V; k++) if (z[k] > mx) mx = z[k];
            for (int k = 0; k < V; k++) s += exp((z[k] - mx) / run->a.temperature);
            double u = rng_uniform(&run->sample_rng) * s, acc = 0.0;
            next = V - 1;
            for (int k = 0; k < V; k++) { acc += exp((z[k] - mx) / run->a.temperature); if (acc > u) { next = k; break; } }
        }
        ctx[i] = next;
        if (run->have_tok) tokenizer_print(&run->tok, next, stdout); else printf(" %d", next);
    }
    printf("\n");
    fflush(stdout);
    free(ctx); free(z);
}

/* evaluation and sampling of the model as it is (-steps 0) */
static void evaluate_only(Run* run) {
    const Args* a = &run->a;
    if (run->have_val) {
        double vl = evaluate(run, a->pred_out[0] ? a->pred_out : NULL);
        logger_line(&run->log, "{\"type\":\"eval\",\"step\":%lld,\"val_loss\":%s,\"ppl\":%s}", (long long)run->ts.step, jnum(vl).s, jnum(exp(vl)).s);
        printf("eval step %lld | val loss %.6f | ppl %.3f\n", (long long)run->ts.step, vl, exp(vl));
    }
    if (a->sample_every) sample(run);
    if (!run->have_val && !a->sample_every)
        printf("note: -steps 0 without -val or -sample_every: the model was built and checked, nothing else to do\n");
}

#endif
