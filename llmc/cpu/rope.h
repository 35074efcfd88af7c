/* rope.h: rotary position embedding tables, shared by the CPU and CUDA trainers.
 *   inv_freq[i] = theta^(-2i/hd), i = 0 .. hd/2-1  (computed in double, stored fp32)
 *   Llama-3 scaling (factor f, low, high, orig): wl = 2*pi/freq;
 *     wl < orig/high: freq;  wl > orig/low: freq/f;  else s = (orig/wl - low)/(high - low),
 *     (1-s)*freq/f + s*freq.
 *   cos[t][i] = cos(t*inv_freq[i]), sin[t][i] = sin(t*inv_freq[i]), tables [T, hd/2].
 * Application on one head vector x (halves x1 = x[:hd/2], x2 = x[hd/2:]):
 *   HF:       y1 = x1*cos - x2*sin,  y2 = x2*cos + x1*sin      (q*cos + rotate_half(q)*sin)
 *   nanochat: y1 = x1*cos + x2*sin,  y2 = -x1*sin + x2*cos      (the other direction)
 * The backward pass is the inverse rotation, i.e. the same formula with sin negated. */
#ifndef TSDC_ROPE_H
#define TSDC_ROPE_H

#include <math.h>
#include "../host/config.h"

#ifdef __CUDACC__
#define TSDC_HD __host__ __device__
#else
#define TSDC_HD
#endif

static inline void rope_inv_freq(const Config* c, float* inv_freq /* [hd/2] */) {
    int half = c->head_dim / 2;
    for (int i = 0; i < half; i++) {
        /* the exponent as HF computes it: arange(0, hd, 2) / hd, in float32 */
        float e = (float)(2 * i) / (float)c->head_dim;
        double freq = 1.0 / pow(c->rope_theta, (double)e);
        if (c->rope_llama3) {
            double lo_wl = c->rope_orig / c->rope_low, hi_wl = c->rope_orig / c->rope_high;
            double wl = 2.0 * M_PI / freq;
            if (wl < hi_wl) { /* keep */ }
            else if (wl > lo_wl) freq = freq / c->rope_factor;
            else {
                double s = (c->rope_orig / wl - c->rope_low) / (c->rope_high - c->rope_low);
                freq = (1.0 - s) * freq / c->rope_factor + s * freq;
            }
        }
        inv_freq[i] = (float)freq;
    }
}

/* cos/sin tables [T, hd/2]; angle t*inv_freq computed in fp32 like torch's outer product */
static inline void rope_tables(const Config* c, int T, float* cos_t, float* sin_t) {
    int half = c->head_dim / 2;
    float* inv = (float*)mallocCheck(sizeof(float) * half);
    rope_inv_freq(c, inv);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            float ang = (float)t * inv[i];
            cos_t[t * half + i] = cosf(ang);
            sin_t[t * half + i] = sinf(ang);
        }
    free(inv);
}

/* rotate one pair; dir = +1 forward, -1 inverse (backward) */
static inline TSDC_HD void rope_rotate_pair(int style, float x1, float x2, float c, float s, float* y1, float* y2) {
    if (style == ROPE_HF) { *y1 = x1 * c - x2 * s; *y2 = x2 * c + x1 * s; }
    else                  { *y1 = x1 * c + x2 * s; *y2 = -x1 * s + x2 * c; }
}

#endif
