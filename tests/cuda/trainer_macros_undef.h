/* the macros both trainers define (model-code shorthands and the fault sites), undefined: test_sdc.cu
 * includes this before train_sdc.c (whose definitions then replace train_sdc.cu's inside namespace cpu)
 * and again after it (so neither trainer's leaks into the tests). No include guard: it is meant to be
 * included twice. */
#undef W
#undef WT
#undef GR
#undef BF16_STORE
#undef CARVE
#undef FAULT
#undef FAULT_AT
#undef FAULT_FWD
#undef FAULT_BWD
#undef FAULT_AT_LD
#undef FAULT_FWD_LD
#undef FAULT_BWD_LD
#undef STORE
#undef STORE_GRAD
#undef check_alarm
