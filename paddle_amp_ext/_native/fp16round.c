/* One-pass rounding of float32 values to the nearest float16 or bfloat16 value (ties to even)
 * and back to float32. Built and loaded by paddle_amp_ext/_native/build.py; no Python or Paddle
 * headers. In both, dst may be src (in place).
 *
 * float16, with the x86 F16C instructions (vcvtps2ph / vcvtph2ps), chosen at run time:
 * vcvtps2ph with an explicit rounding immediate rounds to nearest-even, turns values beyond
 * float16's range into +-inf, keeps nan and the sign of zero, and produces float16 subnormals;
 * vcvtph2ps widens exactly. FTZ and DAZ are cleared around the loop, so the caller's MXCSR
 * (some BLAS set them) cannot flush float16 subnormals or their float32 inputs.
 *
 * bfloat16 is float32's upper 16 bits, so rounding is integer arithmetic on the bit pattern:
 * add 0x7fff plus the lowest kept bit (ties to even), clear the low 16 bits. A carry moves into
 * the exponent exactly as rounding up to the next binade does, the largest finite values round
 * to inf, subnormals round as subnormals (no MXCSR involved), the sign of zero is kept; nan
 * becomes a quiet nan of the same sign (the carry could otherwise turn its payload into inf).
 * AVX2 (8 values per instruction) where the CPU has it, else the same arithmetic in plain C.
 *
 * Both use AVX-512F (16 values per instruction) where the CPU and the OS have it: the same
 * conversions and the same integer arithmetic, one vector twice as wide, then the narrower
 * code for the tail. pae_vector_bits caps the width (the tests run every path on one CPU).
 *
 * pae_all_finite: whether no value of a float32 array is inf or nan (exponent bits all ones),
 * read once (AVX2 where the CPU has it); the rehearsal's non-finite checks use it instead of a
 * reduction kernel and a host read.
 *
 * pae_fp8_quant, pae_fp8_block_amax, pae_fp8_quant_scaled, pae_fp8_quant_cols, pae_fp8_quant_both (at the
 * end of this file): the FP8 rehearsal's e4m3fn/e5m2 rounding with CUDA's saturation, counting and amax in one pass.
 */
#include <stdint.h>
#include <string.h>

#define PAE_BF16_KEEP 0xffff0000u
#define PAE_ABS 0x7fffffffu
#define PAE_INF 0x7f800000u
#define PAE_QUIET 0x00400000u

static inline uint32_t round_bf16_bits(uint32_t b) {
    if ((b & PAE_ABS) > PAE_INF) return (b | PAE_QUIET) & PAE_BF16_KEEP;
    return (b + 0x7fffu + ((b >> 16) & 1u)) & PAE_BF16_KEEP;
}

static void round_bf16_scalar(const float *src, float *dst, int64_t i, int64_t n) {
    for (; i < n; i++) {
        uint32_t b;
        memcpy(&b, src + i, sizeof b);
        b = round_bf16_bits(b);
        memcpy(dst + i, &b, sizeof b);
    }
}

static int all_finite_scalar(const float *src, int64_t i, int64_t n) {
    for (; i < n; i++) {
        uint32_t b;
        memcpy(&b, src + i, sizeof b);
        if ((b & PAE_INF) == PAE_INF) return 0;
    }
    return 1;
}

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include <immintrin.h>

#define PAE_MXCSR_FTZ_DAZ 0x8040u

__attribute__((target("avx,f16c")))
static void round_f16c(const float *src, float *dst, int64_t n) {
    int64_t i = 0;
    unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr & ~PAE_MXCSR_FTZ_DAZ);
    for (; i + 8 <= n; i += 8) {
        __m128i half = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(half));
    }
    for (; i < n; i++) {
        __m128i half = _mm_cvtps_ph(_mm_set_ss(src[i]), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        dst[i] = _mm_cvtss_f32(_mm_cvtph_ps(half));
    }
    _mm_setcsr(csr);
}

__attribute__((target("avx2")))
static void round_bf16_avx2(const float *src, float *dst, int64_t n) {
    const __m256i keep = _mm256_set1_epi32((int)PAE_BF16_KEEP), abs = _mm256_set1_epi32((int)PAE_ABS);
    const __m256i inf = _mm256_set1_epi32((int)PAE_INF), quiet = _mm256_set1_epi32((int)PAE_QUIET);
    const __m256i half = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i b = _mm256_loadu_si256((const __m256i *)(src + i));
        __m256i even = _mm256_and_si256(_mm256_srli_epi32(b, 16), one);
        __m256i rounded = _mm256_and_si256(_mm256_add_epi32(b, _mm256_add_epi32(half, even)), keep);
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, abs), inf);  /* |b| <= 0x7fffffff: signed is fine */
        __m256i quieted = _mm256_and_si256(_mm256_or_si256(b, quiet), keep);
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_blendv_epi8(rounded, quieted, nan));
    }
    round_bf16_scalar(src, dst, i, n);
}

__attribute__((target("avx512f")))
static void round_f16c_avx512(const float *src, float *dst, int64_t n) {
    int64_t i = 0;
    unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr & ~PAE_MXCSR_FTZ_DAZ);
    for (; i + 16 <= n; i += 16) {
        __m256i half = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(half));
    }
    _mm_setcsr(csr);
    if (i < n) round_f16c(src + i, dst + i, n - i);
}

__attribute__((target("avx512f")))
static void round_bf16_avx512(const float *src, float *dst, int64_t n) {
    const __m512i keep = _mm512_set1_epi32((int)PAE_BF16_KEEP), abs = _mm512_set1_epi32((int)PAE_ABS);
    const __m512i inf = _mm512_set1_epi32((int)PAE_INF), quiet = _mm512_set1_epi32((int)PAE_QUIET);
    const __m512i half = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i b = _mm512_loadu_si512((const void *)(src + i));
        __m512i even = _mm512_and_si512(_mm512_srli_epi32(b, 16), one);
        __m512i rounded = _mm512_and_si512(_mm512_add_epi32(b, _mm512_add_epi32(half, even)), keep);
        __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(b, abs), inf);
        __m512i quieted = _mm512_and_si512(_mm512_or_si512(b, quiet), keep);
        _mm512_storeu_si512((void *)(dst + i), _mm512_mask_blend_epi32(nan, rounded, quieted));
    }
    round_bf16_scalar(src, dst, i, n);
}

__attribute__((target("avx2")))
static int all_finite_avx2(const float *src, int64_t n) {
    const __m256i inf = _mm256_set1_epi32((int)PAE_INF);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {  /* four vectors per test: one branch per 128 bytes */
        __m256i any = _mm256_setzero_si256();
        for (int k = 0; k < 32; k += 8) {
            __m256i e = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(src + i + k)), inf);
            any = _mm256_or_si256(any, _mm256_cmpeq_epi32(e, inf));
        }
        if (!_mm256_testz_si256(any, any)) return 0;
    }
    return all_finite_scalar(src, i, n);
}

static int supported = -1;
static int has_avx2 = -1;
static int has_avx512 = -1;
static int width_cap = 512;

static int avx2(void) {
    if (has_avx2 < 0) {
        __builtin_cpu_init();
        has_avx2 = __builtin_cpu_supports("avx2");
    }
    return has_avx2;
}

static int avx512(void) {
    if (has_avx512 < 0) {
        __builtin_cpu_init();
        has_avx512 = __builtin_cpu_supports("avx512f");  /* libgcc checks the OS saves the state */
    }
    return has_avx512 && width_cap >= 512;
}

int pae_fp16_supported(void) {
    if (supported < 0) {
        __builtin_cpu_init();
        supported = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
    }
    return supported;
}

/* Returns 0, or -1 where this CPU has no F16C (nothing written). */
int pae_round_fp16(const float *src, float *dst, int64_t n) {
    if (supported <= 0 && !pae_fp16_supported()) return -1;
    if (avx512()) round_f16c_avx512(src, dst, n);
    else round_f16c(src, dst, n);
    return 0;
}

/* Returns 0 (every CPU can). */
int pae_round_bf16(const float *src, float *dst, int64_t n) {
    if (avx512()) round_bf16_avx512(src, dst, n);
    else if (avx2() && width_cap >= 256) round_bf16_avx2(src, dst, n);
    else round_bf16_scalar(src, dst, 0, n);
    return 0;
}

/* Caps the vector width the roundings use at limit bits (512, 256, or 128: plain C for
 * bfloat16, F16C's 8-wide conversion for float16) when limit > 0, for this process; returns the
 * widest the bfloat16 rounding uses now. */
int pae_vector_bits(int limit) {
    if (limit > 0) width_cap = limit;
    if (avx512()) return 512;
    return avx2() && width_cap >= 256 ? 256 : 128;
}

/* Returns 1 when none of the n values is inf or nan, else 0. */
int pae_all_finite(const float *src, int64_t n) {
    return avx2() ? all_finite_avx2(src, n) : all_finite_scalar(src, 0, n);
}

#else

int pae_fp16_supported(void) { return 0; }

int pae_round_fp16(const float *src, float *dst, int64_t n) {
    (void)src; (void)dst; (void)n;
    return -1;
}

int pae_round_bf16(const float *src, float *dst, int64_t n) {
    round_bf16_scalar(src, dst, 0, n);
    return 0;
}

int pae_all_finite(const float *src, int64_t n) { return all_finite_scalar(src, 0, n); }

int pae_vector_bits(int limit) {
    (void)limit;
    return 128;
}

#endif

/* ---- FP8 (e4m3fn, e5m2) with CUDA's saturating conversion, for the FP8 rehearsal ------------------
 *
 * The arithmetic of paddle_amp_ext/fp8/formats.py:quantize, one element at a time, in one pass:
 * round the significand of |y| to 3 (e4m3fn) or 2 (e5m2) bits, ties to even (add half an ulp
 * minus one plus the lowest kept bit, cut: a carry moves into the exponent); below the smallest
 * normal, (|y| + magic) - magic rounds to the subnormal quantum (magic's float32 ulp is the
 * quantum), ties to even; NaN takes the subnormal branch and stays NaN; finite values beyond the
 * range and inf become max (__NV_SATFINITE); the sign is put back (a value rounded to zero keeps
 * it). Selects only, no branches, so the compiler vectorizes the loop (O3 for these functions).
 *
 * pae_fp8_quant: for a row-major [rows, cols] float32 array in blocks of br x bc (the last ones
 * may be partial; no padding needed), y = src * scale[block] in float32, q = fp8(y), and
 * dst = q (dequant 0) or q * (1.0f / scale[block]) (dequant 1: the value the GEMM multiplies).
 * In the same pass it counts into counts[0] the values saturated (|y| beyond max plus half a
 * step, or inf) and into counts[1] those flushed (0 < |y| <= half the smallest subnormal), and
 * keeps in *amax the NaN-ignoring max of |src| (as fmaxf; on the bit patterns: below inf the
 * integer order of |x| is its float order). pae_fp8_block_amax: that amax per block, the first
 * pass a block's scale needs. MXCSR's FTZ/DAZ are cleared around both (the caller's BLAS may
 * have set them): float32 subnormals are multiplied and compared as IEEE says. dst may be src.
 * Both return 0, or -1 for an unknown format (nothing written).
 */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>

typedef struct {
    uint32_t shift, half_minus_one, keep, threshold_bits, flush_bits;
    float magic, min_normal, max;
} pae_fp8_spec;

static int pae_fp8_spec_of(int fmt, pae_fp8_spec *s) {
    if (fmt == 0) {  /* e4m3fn: 3 mantissa bits, smallest normal 2**-6, max 448, threshold 464, flush <= 2**-10 */
        s->shift = 20; s->magic = 0x1p14f; s->min_normal = 0x1p-6f; s->max = 448.0f;
        s->threshold_bits = 0x43e80000u; s->flush_bits = 0x3a800000u;
    } else if (fmt == 1) {  /* e5m2: 2 bits, 2**-14, 57344, 61440, flush <= 2**-17 */
        s->shift = 21; s->magic = 0x1p7f; s->min_normal = 0x1p-14f; s->max = 57344.0f;
        s->threshold_bits = 0x47700000u; s->flush_bits = 0x37000000u;
    } else {
        return -1;
    }
    s->half_minus_one = (1u << (s->shift - 1)) - 1u;
    s->keep = 0xffffffffu << s->shift;
    return 0;
}

#pragma GCC push_options
#pragma GCC optimize("O3", "no-trapping-math")  /* vectorize; no value changes (flags only) */

typedef struct { int64_t saturated, flushed; int32_t amax; } pae_fp8_tally;

/* The loop over src[0..n): each value times SCALE_AT(i), rounded, multiplied by INVERSE_AT(i)
 * (1.0f: exact) into dst, counted, its |x| kept in top. One text for both bodies below. */
#define PAE_FP8_LOOP(SCALE_AT, INVERSE_AT)                                                              \
    const int32_t abs_mask = (int32_t)PAE_ABS, inf = (int32_t)PAE_INF;                                 \
    const int32_t half = (int32_t)s->half_minus_one, keep = (int32_t)s->keep, shift = (int32_t)s->shift; \
    const int32_t threshold = (int32_t)s->threshold_bits, flush = (int32_t)s->flush_bits;             \
    const float magic = s->magic, min_normal = s->min_normal, max = s->max;                            \
    int32_t saturated = 0, flushed = 0;  /* n < 2**31 (the driver's runs are) */                       \
    for (int64_t i = 0; i < n; i++) {                                                                  \
        int32_t xb = src[i], xa = xb & abs_mask, yb, ya, r;                                            \
        int32_t xm = xa > inf ? 0 : xa;  /* NaN ignored, as fmaxf */                                   \
        top = xm > top ? xm : top;                                                                     \
        float x, y, size, normal, out;                                                                 \
        memcpy(&x, &xb, sizeof x);                                                                     \
        y = x * (SCALE_AT);                                                                            \
        memcpy(&yb, &y, sizeof yb);                                                                    \
        ya = yb & abs_mask;                                                                            \
        memcpy(&size, &ya, sizeof size);                                                               \
        r = (int32_t)(((uint32_t)ya + (uint32_t)half + (uint32_t)((ya >> shift) & 1)) & (uint32_t)keep); \
        memcpy(&normal, &r, sizeof normal);                                                            \
        out = size >= min_normal ? normal : (size + magic) - magic;  /* NaN: the second, kept NaN */   \
        out = out > max ? max : out;  /* SATFINITE; NaN compares false: kept */                        \
        memcpy(&r, &out, sizeof r);                                                                    \
        r |= yb & ~abs_mask;  /* the sign, also of a zero */                                           \
        memcpy(&out, &r, sizeof out);                                                                  \
        out *= (INVERSE_AT);                                                                           \
        memcpy(dst + i, &out, sizeof out);                                                             \
        saturated += (ya > threshold) & (ya <= inf);                                                   \
        flushed += (ya != 0) & (ya <= flush);                                                          \
    }                                                                                                  \
    pae_fp8_tally t = {saturated, flushed, top};                                                       \
    return t;

/* One block run: src[0..n) scaled, rounded, multiplied by inverse (1.0f: exact) into dst. */
static inline __attribute__((always_inline)) pae_fp8_tally pae_fp8_body(
        const int32_t *restrict src, int32_t *restrict dst, int64_t n, float scale, float inverse,
        const pae_fp8_spec *restrict s, int32_t top) {
    PAE_FP8_LOOP(scale, inverse)
}

/* A row in column blocks: value i times scale[i], its rounding times inverse[i]. */
static inline __attribute__((always_inline)) pae_fp8_tally pae_fp8_body_cols(
        const int32_t *restrict src, int32_t *restrict dst, int64_t n, const float *restrict scale,
        const float *restrict inverse, const pae_fp8_spec *restrict s, int32_t top) {
    PAE_FP8_LOOP(scale[i], inverse[i])
}

static inline __attribute__((always_inline)) int32_t pae_amax_body(const int32_t *restrict src, int64_t n, int32_t top) {
    for (int64_t i = 0; i < n; i++) {
        int32_t xa = src[i] & (int32_t)PAE_ABS;
        xa = xa > (int32_t)PAE_INF ? 0 : xa;
        top = xa > top ? xa : top;
    }
    return top;
}

static pae_fp8_tally pae_fp8_plain(const int32_t *src, int32_t *dst, int64_t n, float scale, float inverse,
                                   const pae_fp8_spec *s, int32_t top) {
    return pae_fp8_body(src, dst, n, scale, inverse, s, top);
}
static int32_t pae_amax_plain(const int32_t *src, int64_t n, int32_t top) { return pae_amax_body(src, n, top); }
static pae_fp8_tally pae_fp8_cols_plain(const int32_t *src, int32_t *dst, int64_t n, const float *scale,
                                        const float *inverse, const pae_fp8_spec *s, int32_t top) {
    return pae_fp8_body_cols(src, dst, n, scale, inverse, s, top);
}
/* The NaN-ignoring max of |src[i]| into top[i] (bit patterns: their integer order is the float order). */
static void pae_col_amax(const int32_t *restrict src, int32_t *restrict top, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        int32_t xa = src[i] & (int32_t)PAE_ABS;
        xa = xa > (int32_t)PAE_INF ? 0 : xa;
        top[i] = xa > top[i] ? xa : top[i];
    }
}

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
__attribute__((target("avx2")))
static pae_fp8_tally pae_fp8_avx2(const int32_t *src, int32_t *dst, int64_t n, float scale, float inverse,
                                  const pae_fp8_spec *s, int32_t top) {
    return pae_fp8_body(src, dst, n, scale, inverse, s, top);
}
__attribute__((target("avx512f")))
static pae_fp8_tally pae_fp8_avx512(const int32_t *src, int32_t *dst, int64_t n, float scale, float inverse,
                                    const pae_fp8_spec *s, int32_t top) {
    return pae_fp8_body(src, dst, n, scale, inverse, s, top);
}
__attribute__((target("avx2")))
static pae_fp8_tally pae_fp8_cols_avx2(const int32_t *src, int32_t *dst, int64_t n, const float *scale,
                                       const float *inverse, const pae_fp8_spec *s, int32_t top) {
    return pae_fp8_body_cols(src, dst, n, scale, inverse, s, top);
}
__attribute__((target("avx512f")))
static pae_fp8_tally pae_fp8_cols_avx512(const int32_t *src, int32_t *dst, int64_t n, const float *scale,
                                         const float *inverse, const pae_fp8_spec *s, int32_t top) {
    return pae_fp8_body_cols(src, dst, n, scale, inverse, s, top);
}
__attribute__((target("avx2")))
static int32_t pae_amax_avx2(const int32_t *src, int64_t n, int32_t top) { return pae_amax_body(src, n, top); }
__attribute__((target("avx512f")))
static int32_t pae_amax_avx512(const int32_t *src, int64_t n, int32_t top) { return pae_amax_body(src, n, top); }
#endif

#pragma GCC pop_options

typedef pae_fp8_tally (*pae_fp8_fn)(const int32_t *, int32_t *, int64_t, float, float, const pae_fp8_spec *, int32_t);
typedef int32_t (*pae_amax_fn)(const int32_t *, int64_t, int32_t);
typedef pae_fp8_tally (*pae_fp8_cols_fn)(const int32_t *, int32_t *, int64_t, const float *, const float *,
                                         const pae_fp8_spec *, int32_t);

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#define PAE_CSR_SAVE unsigned int pae_csr = _mm_getcsr(); _mm_setcsr(pae_csr & ~PAE_MXCSR_FTZ_DAZ)
#define PAE_CSR_RESTORE _mm_setcsr(pae_csr)
static pae_fp8_fn pae_fp8_pick(void) {
    return avx512() ? pae_fp8_avx512 : (avx2() && width_cap >= 256) ? pae_fp8_avx2 : pae_fp8_plain;
}
static pae_amax_fn pae_amax_pick(void) {
    return avx512() ? pae_amax_avx512 : (avx2() && width_cap >= 256) ? pae_amax_avx2 : pae_amax_plain;
}
static pae_fp8_cols_fn pae_fp8_cols_pick(void) {
    return avx512() ? pae_fp8_cols_avx512 : (avx2() && width_cap >= 256) ? pae_fp8_cols_avx2 : pae_fp8_cols_plain;
}
#else
#define PAE_CSR_SAVE do {} while (0)
#define PAE_CSR_RESTORE do {} while (0)
static pae_fp8_fn pae_fp8_pick(void) { return pae_fp8_plain; }
static pae_amax_fn pae_amax_pick(void) { return pae_amax_plain; }
static pae_fp8_cols_fn pae_fp8_cols_pick(void) { return pae_fp8_cols_plain; }
#endif

#define PAE_RUN ((int64_t)1 << 30)

int pae_fp8_quant(const float *src, float *dst, int64_t rows, int64_t cols, int64_t br, int64_t bc,
                  const float *scale, int fmt, int dequant, int64_t *counts, float *amax) {
    pae_fp8_spec s;
    if (pae_fp8_spec_of(fmt, &s) != 0 || br <= 0 || bc <= 0) return -1;
    pae_fp8_fn run = pae_fp8_pick();
    int64_t nbc = (cols + bc - 1) / bc;
    int32_t top = 0;
    PAE_CSR_SAVE;
    for (int64_t r = 0; r < rows; r++) {
        const float *row_scale = scale + (r / br) * nbc;
        for (int64_t c = 0, k = 0; c < cols; c += bc, k++) {
            float f = row_scale[k], inverse = dequant ? 1.0f / f : 1.0f;
            for (int64_t at = c, end = cols - c < bc ? cols : c + bc; at < end; at += PAE_RUN) {
                int64_t n = end - at < PAE_RUN ? end - at : PAE_RUN;  /* the tally's int32 counts */
                pae_fp8_tally t = run((const int32_t *)(src + r * cols + at), (int32_t *)(dst + r * cols + at),
                                      n, f, inverse, &s, top);
                counts[0] += t.saturated;
                counts[1] += t.flushed;
                top = t.amax;
            }
        }
    }
    PAE_CSR_RESTORE;
    memcpy(amax, &top, sizeof top);
    return 0;
}

int pae_fp8_block_amax(const float *src, int64_t rows, int64_t cols, int64_t br, int64_t bc, float *amax) {
    if (br <= 0 || bc <= 0) return -1;
    pae_amax_fn run = pae_amax_pick();
    int64_t nbr = (rows + br - 1) / br, nbc = (cols + bc - 1) / bc;
    for (int64_t k = 0; k < nbr * nbc; k++) amax[k] = 0.0f;
    for (int64_t r = 0; r < rows; r++) {
        float *row_amax = amax + (r / br) * nbc;
        for (int64_t c = 0, k = 0; c < cols; c += bc, k++) {
            int32_t top;
            memcpy(&top, row_amax + k, sizeof top);
            top = run((const int32_t *)(src + r * cols + c), cols - c < bc ? cols - c : bc, top);
            memcpy(row_amax + k, &top, sizeof top);
        }
    }
    return 0;
}

/* Each of scale[0..n) (an amax) replaced by its scale as Paddle's ScaleWrapper computes it. */
static void pae_scale_wrapper(float *scale, int64_t n, const pae_fp8_spec *s, float epsilon, int pow2) {
    for (int64_t k = 0; k < n; k++) {
        float m = scale[k] > epsilon ? scale[k] : epsilon, f;
        if (m == 0.0f) {
            f = 1.0f;
        } else {
            f = s->max / m;
            if (f == (float)INFINITY) f = pow2 ? 0x1p127f : 0x1.FEp127f;
            if (pow2) {
                uint32_t b;
                memcpy(&b, &f, sizeof b);
                b &= PAE_INF;
                memcpy(&f, &b, sizeof f);
            }
        }
        scale[k] = f;
    }
}

/* pae_fp8_quant_scaled: pae_fp8_block_amax, then each block's scale from its amax as Paddle's
 * ScaleWrapper computes it (fp8_quant_blockwise_kernel.cu; paddle_amp_ext/fp8/blocks.py
 * scale_from_amax): max / fmaxf(amax, epsilon) in float32, 1 when that is 0, 2**127 (pow2) or
 * 0x1.FEp127 when the quotient is inf, only its exponent bits with pow2; written to scale, then
 * pae_fp8_quant with those scales. One call where three took three. */
int pae_fp8_quant_scaled(const float *src, float *dst, int64_t rows, int64_t cols, int64_t br, int64_t bc,
                         float *scale, int fmt, float epsilon, int pow2, int dequant, int64_t *counts, float *amax) {
    pae_fp8_spec s;
    if (pae_fp8_spec_of(fmt, &s) != 0 || pae_fp8_block_amax(src, rows, cols, br, bc, scale) != 0) return -1;
    pae_scale_wrapper(scale, ((rows + br - 1) / br) * ((cols + bc - 1) / bc), &s, epsilon, pow2);
    return pae_fp8_quant(src, dst, rows, cols, br, bc, scale, fmt, dequant, counts, amax);
}

/* pae_fp8_quant_cols: pae_fp8_quant_scaled for blocks of br rows x 1 column (a scale per column
 * of each band of br rows; scale is [ceil(rows/br), cols]), a row at a time: no call per value
 * (the generic loop makes one for blocks one column wide). What the blockwise recipe's weight
 * gradient needs, 1x128 blocks along the tokens, without transposing. Returns 0, or -1 for an
 * unknown format, br <= 0 or no memory (nothing counted). */
int pae_fp8_quant_cols(const float *src, float *dst, int64_t rows, int64_t cols, int64_t br, float *scale,
                       int fmt, float epsilon, int pow2, int dequant, int64_t *counts, float *amax) {
    pae_fp8_spec s;
    if (pae_fp8_spec_of(fmt, &s) != 0 || br <= 0) return -1;
    float *inverse = malloc((size_t)(cols > 0 ? cols : 1) * sizeof(float));
    if (inverse == NULL) return -1;
    pae_fp8_cols_fn run = pae_fp8_cols_pick();
    int32_t top = 0;
    for (int64_t r0 = 0; r0 < rows; r0 += br) {
        int64_t r1 = rows - r0 < br ? rows : r0 + br;
        float *band = scale + (r0 / br) * cols;
        memset(band, 0, (size_t)cols * sizeof(float));
        for (int64_t r = r0; r < r1; r++) pae_col_amax((const int32_t *)(src + r * cols), (int32_t *)band, cols);
        pae_scale_wrapper(band, cols, &s, epsilon, pow2);
        PAE_CSR_SAVE;  /* before the inverses: 1 / 2**127 is a subnormal that FTZ would flush */
        for (int64_t c = 0; c < cols; c++) inverse[c] = dequant ? 1.0f / band[c] : 1.0f;
        for (int64_t r = r0; r < r1; r++) {
            for (int64_t at = 0; at < cols; at += PAE_RUN) {
                int64_t n = cols - at < PAE_RUN ? cols - at : PAE_RUN;  /* the tally's int32 counts */
                pae_fp8_tally t = run((const int32_t *)(src + r * cols + at), (int32_t *)(dst + r * cols + at), n,
                                      band + at, inverse + at, &s, top);
                counts[0] += t.saturated;
                counts[1] += t.flushed;
                top = t.amax;
            }
        }
        PAE_CSR_RESTORE;
    }
    free(inverse);
    memcpy(amax, &top, sizeof top);
    return 0;
}


/* pae_fp8_quant_both: src quantized twice in one call, as the blockwise recipe quantizes an input
 * and an output gradient: pae_fp8_quant_scaled in 1 x bk blocks into dst_rows (scale_rows
 * [rows, ceil(cols/bk)], counts, amax), then pae_fp8_quant_cols in bk x 1 blocks into dst_cols
 * (scale_cols [ceil(rows/bk), cols]; its counts are not kept, its amax is the same). The same
 * functions, so the same values as two calls; dst_rows and dst_cols must not be src. Also the
 * smallest and largest of scale_rows into scale_range[0..1] (what a stats record keeps; the
 * scales are never NaN). Returns 0, or -1 as those do. */
int pae_fp8_quant_both(const float *src, float *dst_rows, float *dst_cols, int64_t rows, int64_t cols, int64_t bk,
                       float *scale_rows, float *scale_cols, int fmt, float epsilon, int pow2, int dequant,
                       int64_t *counts, float *amax, float *scale_range) {
    int64_t quiet[2] = {0, 0}, n = rows * ((cols + bk - 1) / bk);
    float quiet_amax, low, high;
    if (pae_fp8_quant_scaled(src, dst_rows, rows, cols, 1, bk, scale_rows, fmt, epsilon, pow2, dequant, counts,
                             amax) != 0) return -1;
    low = n > 0 ? scale_rows[0] : 0.0f;
    high = low;
    for (int64_t k = 1; k < n; k++) {
        low = scale_rows[k] < low ? scale_rows[k] : low;
        high = scale_rows[k] > high ? scale_rows[k] : high;
    }
    scale_range[0] = low;
    scale_range[1] = high;
    return pae_fp8_quant_cols(src, dst_cols, rows, cols, bk, scale_cols, fmt, epsilon, pow2, dequant, quiet,
                              &quiet_amax);
}
