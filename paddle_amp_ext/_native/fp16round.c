/* float32 -> nearest float16 value (ties to even) -> float32, one pass, with the x86 F16C
 * instructions (vcvtps2ph / vcvtph2ps), chosen at run time. Built and loaded by
 * paddle_amp_ext/_native/build.py; no Python or Paddle headers.
 *
 * vcvtps2ph with an explicit rounding immediate rounds to nearest-even, turns values beyond
 * float16's range into +-inf, keeps nan and the sign of zero, and produces float16 subnormals;
 * vcvtph2ps widens exactly. FTZ and DAZ are cleared around the loop, so the caller's MXCSR
 * (some BLAS set them) cannot flush float16 subnormals or their float32 inputs.
 */
#include <stdint.h>

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

static int supported = -1;

int pae_fp16_supported(void) {
    if (supported < 0) {
        __builtin_cpu_init();
        supported = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
    }
    return supported;
}

/* dst may be src (in place). Returns 0, or -1 where this CPU has no F16C (nothing written). */
int pae_round_fp16(const float *src, float *dst, int64_t n) {
    if (supported <= 0 && !pae_fp16_supported()) return -1;
    round_f16c(src, dst, n);
    return 0;
}

#else

int pae_fp16_supported(void) { return 0; }

int pae_round_fp16(const float *src, float *dst, int64_t n) {
    (void)src; (void)dst; (void)n;
    return -1;
}

#endif
