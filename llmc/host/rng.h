/* rng.h: the seeded random streams (sampling, the fault injector's choices, test inputs; weight init is
 * counter-based: llmc/cpu/init.h).
 * xoshiro256** seeded through splitmix64; normal draws by Box-Muller in double precision, so the
 * same seed gives the same weights on every machine. State is 4 u64 words and is saved in
 * checkpoints, so a resumed run continues the same stream. */
#ifndef TSDC_RNG_H
#define TSDC_RNG_H

#include <math.h>
#include <stdint.h>
#include "checksum.h"

typedef struct { uint64_t s[4]; } Rng;

static inline void rng_seed(Rng* r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) { x += TSDC_GOLDEN; r->s[i] = splitmix64_fin(x); }
}
static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static inline uint64_t rng_u64(Rng* r) {
    uint64_t* s = r->s;
    uint64_t result = rotl64(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl64(s[3], 45);
    return result;
}
/* uniform in [0,1) with 53 random bits */
static inline double rng_uniform(Rng* r) { return (rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }
/* uniform integer in [0, n) without modulo bias */
static inline uint64_t rng_below(Rng* r, uint64_t n) {
    uint64_t lim = UINT64_MAX - UINT64_MAX % n, x;
    do { x = rng_u64(r); } while (x >= lim);
    return x % n;
}
static inline double rng_normal(Rng* r) {
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
