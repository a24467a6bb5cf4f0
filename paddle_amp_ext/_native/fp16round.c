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
