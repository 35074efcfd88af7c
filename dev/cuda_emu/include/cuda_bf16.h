/* cuda_bf16.h (CUDA emulation, dev/cuda_emu): the bfloat16 type and the conversions the project uses,
 * for the host compiler. __nv_bfloat16 is a struct holding the 16 bits (as in the toolkit); conversions:
 *   __float2bfloat16_rn  fp32 -> bf16, round to nearest even; every NaN becomes the canonical NaN
 *                        0x7FFF (sign and payload lost), as the toolkit's cuda_bf16.hpp does on the
 *                        host and cvt.rn.bf16.f32 on the device
 *   __bfloat162float     exact
 *   __bfloat16_as_ushort / __ushort_as_bfloat16   bit casts
 * No arithmetic operators are declared: the project converts to fp32 for every operation (a use of an
 * operator fails to compile here, and would be a precision question on the GPU as well). */
#ifndef CUDA_EMU_CUDA_BF16_H
#define CUDA_EMU_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
    unsigned short __x;
};
typedef struct __nv_bfloat16 nv_bfloat16;
struct __nv_bfloat16_raw {
    unsigned short x;
};

static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {          /* NaN: the canonical 0x7FFF */
        r.__x = 0x7fffu;
        return r;
    }
    u += 0x7fffu + ((u >> 16) & 1u);                 /* round to nearest, ties to even */
    r.__x = (unsigned short)(u >> 16);
    return r;
}
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.__x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
    __nv_bfloat16 r;
    r.__x = u;
    return r;
}
static inline short __bfloat16_as_short(__nv_bfloat16 h) { return (short)h.__x; }
static inline __nv_bfloat16 __short_as_bfloat16(short s) { return __ushort_as_bfloat16((unsigned short)s); }

#endif
