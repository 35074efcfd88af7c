/* backend.h: the contract between the host loop (llmc/host/train_loop.h) and a trainer's model, as code.
 *
 * Each trainer (train_sdc.c on the CPU, train_sdc.cu on the GPU) defines its Model, a struct with at least
 * `Config c; ParamLayout L; int B, T; Protect prot;`, then includes this file, which declares every
 * function the loop calls (so the compiler checks each trainer's definitions against one list) and
 * defines, once for both, the accessors of the shared protection state (Protect, llmc/sdc/checks.h).
 *
 * No include guard, on purpose: test_sdc.cu compiles both trainers in one translation unit (the CPU one
 * inside namespace cpu), and each needs the declarations for its own Model.
 *
 * A trainer also defines, before it includes llmc/host/train_loop.h: TRAINER_NAME (a string), TRAINER_GPU (1 for
 * the CUDA trainer: the check kinds it provides are the `gpu` column of PROT_KINDS), TRAINER_DEFAULT_PRECISION
 * (0 fp32, 1 bf16), TRAINER_HAS_FP32 (0/1), TRAINER_BF16_NAME (how its bf16 is described), and optionally
 * TRAINER_SETUP(dist) / TRAINER_TEARDOWN() (device selection, NCCL) and TRAINER_KERNELS(precision) (a string naming
 * the compute paths chosen at run time, printed at the start and logged; empty by default). */

/* building, the weights and the optimizer state (host fp32 arrays; m, v NULL: zero) */
static void model_build(Model* model, const Config* c, int B, int T, int precision);
static void model_free(Model* model);
static void model_init_weights(Model* model, uint64_t seed);
static size_t model_num_params(const Model* model);
static void model_load_state(Model* model, const float* params, const float* m, const float* v);
static void model_host_state(Model* model, const float** params, const float** m, const float** v);
static uint64_t model_weights_checksum(Model* model);
static int model_threads(void);
static void model_set_threads(int n);

/* one microbatch: tokens (targets NULL: none), the forward (mean loss), the backward (adds into the gradients) */
static void model_set_tokens(Model* model, const int* inputs, const int* targets, int n);
static float model_forward_step(Model* model, int B, int T, int with_targets);
static void model_backward_step(Model* model, int B, int T, float dloss);
static void model_token_losses(Model* model, int n, float* out);
static void model_argmax(Model* model, int n, int* out);
static void model_logits_row(Model* model, int row, float* out);
/* the next forward with targets is a training microbatch's, followed by model_backward_step(dloss) with nothing
 * reading the logits in between: the trainer may compute the backward's dlogits in the same pass (the GPU's
 * one-pass classifier; the CPU ignores it) */
static void model_classifier_fused_next(Model* model, float dloss);

/* the step: gradients, their reduction, the update (returns the gradient norm before clipping) */
static void model_zero_grads(Model* model);
static void model_reduce_in_backward(Model* model, Dist* dist);   /* the next backward is the step's last: it may start the reduction */
static void model_allreduce_grads(Model* model, Dist* dist);      /* the gradients summed over the ranks (completes that) */
static double model_update(Model* model, const AdamW* opt, long long t, double clip);
static int model_unscale_check(Model* model, float s);          /* grads *= s; 1 if a gradient is non-finite */
static double model_grad_norm(Model* model);
static double model_update_norm(Model* model, const AdamW* o, long long t, double clip, double grad_norm);
static double model_grad_sumsq_range(Model* model, size_t off, size_t n);   /* the backward guard's groups */

/* the protection's statistics from the last forward, and the device's work counts (llmc/host/stats.h; 0: none) */
static void model_rgg_gains(Model* model, int B, int T, const int* layers, int n_mon, double* out);
static int model_device_stats(Model* model, DeviceStats* st);

/* the propagation trace: keep the activations of the last forward; ||x - x_snapshot||^2 and ||x_snapshot||^2 of a
 * site's forward tensor (site -1: the logits) */
static void model_trace_snapshot(Model* model);
static void model_trace_diff(Model* model, int site, int l, int B, int T, double* num, double* den);

/* ------------------------------------------------------------------ the shared protection state's accessors */
/* the trainer's storage for the flips fx makes (the CPU's -precision bf16 keeps a tensor that takes fp32 flips in a
 * float array; called before the first forward) */
static void model_fault_storage(Model* model, const FaultCtx* fx);
static void model_set_fault(Model* model, FaultCtx* fx) { model->prot.fx = fx; model_fault_storage(model, fx); }
/* a kind of PROT_KINDS on or off in the passes (the host loop sets every kind from -protect; a kind the
 * trainer does not provide is never set on: PROT_KINDS' gpu column) */
static void model_set_protect(Model* model, int kind, int on) { model->prot.on[kind] = on != 0; }
/* the ABFT checksums of the attention products (the baseline -detect abft) */
static void model_set_abft(Model* model, int on) { model->prot.abft = on != 0; }
/* alarms of one kind (CHECK_*) since model_qk_reset (the loop resets before each microbatch's forward), and
 * the first layer that had one (-1: none) */
static int model_check_alarms(Model* model, int kind, int* first_layer) {
    if (kind < 0 || kind >= CHECK_KINDS) { *first_layer = -1; return 0; }
    *first_layer = model->prot.alarms[kind] ? model->prot.first_layer[kind] : -1;
    return model->prot.alarms[kind];
}
/* every check's alarms back to none */
static void model_qk_reset(Model* model) {
    for (int k = 0; k < CHECK_KINDS; k++) { model->prot.alarms[k] = 0; model->prot.first_layer[k] = -1; }
}
/* (re)start exponent profiling: the histograms of dL/dY's codes start from zero */
static void model_exp_profile_start(Model* model, int samples, uint64_t seed) {
    if (!model->prot.exp_hist) model->prot.exp_hist = (uint32_t*)callocCheck((size_t)model->L.n * 256, sizeof(uint32_t));
    memset(model->prot.exp_hist, 0, (size_t)model->L.n * 256 * sizeof(uint32_t));
    model->prot.exp_samples = samples;
    rng_seed(&model->prot.exp_rng, seed);
}
static void model_exp_profile_stop(Model* model) { model->prot.exp_samples = 0; }
static const uint32_t* model_exp_hist(Model* model) { return model->prot.exp_hist; }
