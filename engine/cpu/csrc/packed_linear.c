/* y = x W^T (+ b) in float32, with W kept in the narrowest form that holds its values exactly.
 *
 * A model converted from a GGUF file has weights that are 4- or 8-bit codes times per-block scales: stored as
 * float32 they are 4 to 6 times the bytes they need, and a decode step at a small batch spends its time streaming
 * them from memory. engine/cpu/packed_linear.py finds, per layer, a form that reproduces every float32 weight bit for
 * bit (checked when the model loads) and packs it here; each product is then the same float32 multiply-adds, only
 * the weights cross the memory bus in their compact form and are widened in registers.
 *
 * Forms (-DFORM_Q4, -DFORM_Q8, -DFORM_Q4F, -DFORM_Q8F, -DFORM_BF16), each in panels of 16 output features, k-major inside a panel so that
 * a panel widens straight into the [k][16] layout the multiply below reads:
 *   Q4:   per 32 k's: d[16] and m[16] (float16), then 32 x 8 bytes, byte j of row k holding q[k][j] in its low
 *         nibble and q[k][j + 8] in its high one; w = d * q + m (d * q is exact, so one rounding, as a GGUF Q4_1).
 *   Q8:   per 32 k's: d[16] (float16), then 32 x 16 int8; w = d * q (exact, as a GGUF Q8_0).
 *   Q4F:  Q4 with d and m float32: GGUF's Q4_K, whose 32-weight sub-blocks are (d * sc) * q - dmin * m, both
 *         products exact in float32 but not in float16.
 *   Q8F:  per 32 k's: d[2][16] (float32; the first for k's 0..15, the second for 16..31), then 32 x 16 int8;
 *         w = d * q: GGUF's Q6_K, whose 16-weight sub-blocks are (d * sc) * (q - 32).
 *   BF16: per k: 16 bfloat16 (the upper halves of the float32 weights).
 * The multiply is a 6 x 16 register tile (12 vector accumulators of 8 floats) over a panel widened into scratch,
 * K taken in chunks that keep the scratch in L1. Written with GCC's vector extensions, so -march=native picks the
 * host's instructions (AVX2 + FMA on the machines this was measured on).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PANEL 16
#define BLOCK 32
#define ROWS 6
#define KC 256 /* k's per chunk: a widened chunk is KC * 16 floats = 16 KiB */

typedef float f32x8 __attribute__((vector_size(32), aligned(4)));
typedef float f32x8a __attribute__((vector_size(32)));

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
/* Eight float16 at p, widened. */
static inline f32x8a halves(const uint16_t *p) { return (f32x8a)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
/* Eight unsigned bytes at p, masked by `mask` after a right shift by `shift`, as floats. */
static inline f32x8a nibbles(const uint8_t *p, int shift) {
    const __m256i wide = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    return (f32x8a)_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(wide, shift), _mm256_set1_epi32(15)));
}
static inline f32x8a signed_bytes(const int8_t *p) {
    return (f32x8a)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline f32x8a upper_halves(const uint16_t *p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return (f32x8a)_mm256_slli_epi32(wide, 16);
}
#else
/* Plain C where the host lacks AVX2, F16C or FMA: the compiler vectorises what it can. */
static inline f32x8a halves(const uint16_t *p) {
    f32x8a v;
    for (int i = 0; i < 8; ++i) {
        _Float16 h;
        memcpy(&h, p + i, sizeof h);
        v[i] = (float)h;
    }
    return v;
}
static inline f32x8a nibbles(const uint8_t *p, int shift) {
    f32x8a v;
    for (int i = 0; i < 8; ++i) v[i] = (float)((p[i] >> shift) & 15);
    return v;
}
static inline f32x8a signed_bytes(const int8_t *p) {
    f32x8a v;
    for (int i = 0; i < 8; ++i) v[i] = (float)p[i];
    return v;
}
static inline f32x8a upper_halves(const uint16_t *p) {
    f32x8a v;
    for (int i = 0; i < 8; ++i) {
        const uint32_t bits = (uint32_t)p[i] << 16;
        memcpy(&v[i], &bits, sizeof bits);
    }
    return v;
}
#endif

#if defined(FORM_Q4)
#define BLOCK_BYTES (PANEL * 2 * 2 + BLOCK * PANEL / 2)
/* Widens k's [k0, k0 + n) of one panel (k0 and n multiples of BLOCK) into out[n][16]. */
static void widen(const uint8_t *panel, int64_t k0, int64_t n, float *restrict out) {
    for (int64_t b = 0; b < n / BLOCK; ++b) {
        const uint8_t *block = panel + (k0 / BLOCK + b) * BLOCK_BYTES;
        const uint16_t *scales = (const uint16_t *)block;
        const f32x8a d_lo = halves(scales), d_hi = halves(scales + 8);
        const f32x8a m_lo = halves(scales + 16), m_hi = halves(scales + 24);
        const uint8_t *codes = block + PANEL * 4;
        float *dst = out + b * BLOCK * PANEL;
        for (int k = 0; k < BLOCK; ++k) {
            *(f32x8 *)(dst + k * PANEL) = d_lo * nibbles(codes + k * 8, 0) + m_lo;
            *(f32x8 *)(dst + k * PANEL + 8) = d_hi * nibbles(codes + k * 8, 4) + m_hi;
        }
    }
}
#elif defined(FORM_Q8)
#define BLOCK_BYTES (PANEL * 2 + BLOCK * PANEL)
static void widen(const uint8_t *panel, int64_t k0, int64_t n, float *restrict out) {
    for (int64_t b = 0; b < n / BLOCK; ++b) {
        const uint8_t *block = panel + (k0 / BLOCK + b) * BLOCK_BYTES;
        const f32x8a d_lo = halves((const uint16_t *)block), d_hi = halves((const uint16_t *)block + 8);
        const int8_t *codes = (const int8_t *)(block + PANEL * 2);
        float *dst = out + b * BLOCK * PANEL;
        for (int k = 0; k < BLOCK; ++k) {
            *(f32x8 *)(dst + k * PANEL) = d_lo * signed_bytes(codes + k * PANEL);
            *(f32x8 *)(dst + k * PANEL + 8) = d_hi * signed_bytes(codes + k * PANEL + 8);
        }
    }
}
#elif defined(FORM_Q4F)
#define BLOCK_BYTES (PANEL * 4 * 2 + BLOCK * PANEL / 2)
static void widen(const uint8_t *panel, int64_t k0, int64_t n, float *restrict out) {
    for (int64_t b = 0; b < n / BLOCK; ++b) {
        const uint8_t *block = panel + (k0 / BLOCK + b) * BLOCK_BYTES;
        const float *scales = (const float *)block;
        const f32x8a d_lo = *(const f32x8 *)scales, d_hi = *(const f32x8 *)(scales + 8);
        const f32x8a m_lo = *(const f32x8 *)(scales + 16), m_hi = *(const f32x8 *)(scales + 24);
        const uint8_t *codes = block + PANEL * 8;
        float *dst = out + b * BLOCK * PANEL;
        for (int k = 0; k < BLOCK; ++k) {
            *(f32x8 *)(dst + k * PANEL) = d_lo * nibbles(codes + k * 8, 0) + m_lo;
            *(f32x8 *)(dst + k * PANEL + 8) = d_hi * nibbles(codes + k * 8, 4) + m_hi;
        }
    }
}
#elif defined(FORM_Q8F)
#define BLOCK_BYTES (PANEL * 4 * 2 + BLOCK * PANEL)
static void widen(const uint8_t *panel, int64_t k0, int64_t n, float *restrict out) {
    for (int64_t b = 0; b < n / BLOCK; ++b) {
        const uint8_t *block = panel + (k0 / BLOCK + b) * BLOCK_BYTES;
        const float *scales = (const float *)block;
        const int8_t *codes = (const int8_t *)(block + PANEL * 8);
        float *dst = out + b * BLOCK * PANEL;
        for (int half = 0; half < 2; ++half) {
            const f32x8a d_lo = *(const f32x8 *)(scales + half * PANEL), d_hi = *(const f32x8 *)(scales + half * PANEL + 8);
            for (int k = half * BLOCK / 2; k < (half + 1) * BLOCK / 2; ++k) {
                *(f32x8 *)(dst + k * PANEL) = d_lo * signed_bytes(codes + k * PANEL);
                *(f32x8 *)(dst + k * PANEL + 8) = d_hi * signed_bytes(codes + k * PANEL + 8);
            }
        }
    }
}
#elif defined(FORM_BF16)
#define BLOCK_BYTES (BLOCK * PANEL * 2)
static void widen(const uint8_t *panel, int64_t k0, int64_t n, float *restrict out) {
    const uint16_t *src = (const uint16_t *)panel + k0 * PANEL;
    for (int64_t i = 0; i < n * PANEL; i += 8) *(f32x8 *)(out + i) = upper_halves(src + i);
}
#else
#error "build with -DFORM_Q4, -DFORM_Q8, -DFORM_Q4F, -DFORM_Q8F or -DFORM_BF16"
#endif

/* c[r][0..16) (+)= sum over k < n of a[r][k] * b[k][0..16) for the R rows r < R (R constant, so the
 * accumulators stay in registers); columns >= cols are not written. A multiply-add waits 4 cycles for the one
 * before it on the same accumulator and two issue per cycle, so fewer than 8 accumulators leave the pipes idle:
 * tiles of 1 to 3 rows keep U partial sums (k, k + 1, ...) and add them up at the end (n is a multiple of 32). */
#define TILE(R, U)                                                                                                \
    static void tile_##R(const float *a, int64_t lda, const float *restrict b, int64_t n, float *c, int64_t ldc, \
                         int cols, int accumulate) {                                                              \
        f32x8a acc[U][R][2];                                                                                      \
        for (int u = 0; u < U; ++u)                                                                               \
            for (int r = 0; r < R; ++r) acc[u][r][0] = acc[u][r][1] = (f32x8a){0};                                \
        for (int64_t k = 0; k < n; k += U) {                                                                      \
            for (int u = 0; u < U; ++u) {                                                                         \
                const float *bk = b + (k + u) * PANEL;                                                            \
                const f32x8a b0 = *(const f32x8 *)bk, b1 = *(const f32x8 *)(bk + 8);                              \
                for (int r = 0; r < R; ++r) {                                                                     \
                    const float x = a[r * lda + k + u];                                                           \
                    acc[u][r][0] += x * b0;                                                                       \
                    acc[u][r][1] += x * b1;                                                                       \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
        for (int u = 1; u < U; ++u)                                                                               \
            for (int r = 0; r < R; ++r) {                                                                         \
                acc[0][r][0] += acc[u][r][0];                                                                     \
                acc[0][r][1] += acc[u][r][1];                                                                     \
            }                                                                                                     \
        for (int r = 0; r < R; ++r) {                                                                             \
            float *dst = c + r * ldc;                                                                             \
            if (cols == PANEL && accumulate) {                                                                    \
                *(f32x8 *)dst += acc[0][r][0];                                                                    \
                *(f32x8 *)(dst + 8) += acc[0][r][1];                                                              \
            } else if (cols == PANEL) {                                                                           \
                *(f32x8 *)dst = acc[0][r][0];                                                                     \
                *(f32x8 *)(dst + 8) = acc[0][r][1];                                                               \
            } else {                                                                                              \
                for (int j = 0; j < cols; ++j)                                                                    \
                    dst[j] = (accumulate ? dst[j] : 0.0f) + (j < 8 ? acc[0][r][0][j] : acc[0][r][1][j - 8]);      \
            }                                                                                                     \
        }                                                                                                         \
    }
TILE(1, 4)
TILE(2, 2)
TILE(3, 2)
TILE(4, 1)
TILE(5, 1)
TILE(6, 1)

typedef void (*tile_fn)(const float *, int64_t, const float *restrict, int64_t, float *, int64_t, int, int);
static const tile_fn TILES[ROWS + 1] = {NULL, tile_1, tile_2, tile_3, tile_4, tile_5, tile_6};

/* x [m][k] (row stride ldx), packed W (n outputs, k inputs; k a multiple of 32), bias [n] or NULL, y [m][n] (row
 * stride ldy). 0 on success, 1 where scratch memory ran out. */
int packed_linear(const float *x, int64_t ldx, const uint8_t *packed, const float *bias, float *y, int64_t ldy,
                  int64_t m, int64_t n, int64_t k, int threads) {
    const int64_t panels = (n + PANEL - 1) / PANEL;
    const int64_t panel_bytes = (k / BLOCK) * BLOCK_BYTES;
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        float *scratch = aligned_alloc(64, sizeof(float) * KC * PANEL);
        if (scratch == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; ++p) {
            if (scratch == NULL) continue;
            const int cols = n - p * PANEL < PANEL ? (int)(n - p * PANEL) : PANEL;
            float *yp = y + p * PANEL;
            for (int64_t k0 = 0; k0 < k; k0 += KC) {
                const int64_t kn = k - k0 < KC ? k - k0 : KC;
                widen(packed + p * panel_bytes, k0, kn, scratch);
                for (int64_t r = 0; r < m; r += ROWS) {
                    const int rows = m - r < ROWS ? (int)(m - r) : ROWS;
                    TILES[rows](x + r * ldx + k0, ldx, scratch, kn, yp + r * ldy, ldy, cols, k0 > 0);
                }
            }
            if (bias != NULL)
                for (int64_t r = 0; r < m; ++r)
                    for (int j = 0; j < cols; ++j) yp[r * ldy + j] += bias[p * PANEL + j];
        }
        free(scratch);
    }
    return failed;
}
