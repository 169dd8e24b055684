/* y = x W^T (+ b) in float32, with W kept in the narrowest form that holds its values exactly.
 *
 * A model converted from a GGUF file has weights that are 4- or 8-bit codes times per-block scales: stored as
 * float32 they are 4 to 6 times the bytes they need, and a decode step at a small batch spends its time streaming
 * them from memory. engine/cpu/packed_linear.py finds, per layer, a form that reproduces every float32 weight bit for
 * bit (checked when the model loads) and packs it here; each product is then the same float32 multiply-adds, only
 * the weights cross the memory bus in their compact form and are widened in registers.
 *
 * Forms (-DFORM_Q4, -DFORM_Q8, -DFORM_Q4F, -DFORM_Q8F, -DFORM_BF16), each in panels of 16 output features,
 * k-major inside a panel so that a panel widens straight into the [k][16] layout the multiply below reads:
 *   Q4:   per 32 k's: d[16] and m[16] (float16), then 32 x 8 bytes, byte j of row k holding q[k][j] in its low
 *         nibble and q[k][j + 8] in its high one; w = d * q + m (d * q is exact, so one rounding, as a GGUF Q4_1).
 *   Q8:   per 32 k's: d[16] (float16), then 32 x 16 int8; w = d * q (exact, as a GGUF Q8_0).
 *   Q4F:  Q4 with d and m float32: GGUF's Q4_K, whose 32-weight sub-blocks are (d * sc) * q - dmin * m, both
 *         products exact in float32 but not in float16.
 *   Q8F:  per 32 k's: d[2][16] (float32; the first for k's 0..15, the second for 16..31), then 32 x 16 int8;
 *         w = d * q: GGUF's Q6_K, whose 16-weight sub-blocks are (d * sc) * (q - 32).
 *   BF16: per k: 16 bfloat16 (the upper halves of the float32 weights).
 * With -DROUND_BF16 each widened weight is rounded to bfloat16 (to nearest, ties to even: what torch's cast does),
 * so a model served in bfloat16 multiplies the very bf16 weights it would hold as a plain layer: its activations are
 * bf16 (exact in float32), each product of two bf16 values is exact in float32, and only the order of the float32
 * sums is this kernel's (the result is rounded to bf16 once, as oneDNN's bf16 layers round theirs).
 * The multiply is a tile of up to 6 rows x 16 outputs in registers (a panel row is one AVX-512 vector, else two
 * of 8 floats) over a panel widened into scratch, K taken in chunks that keep the scratch in L1. Written with GCC's
 * vector extensions, so -march=native picks the host's instructions (AVX2 + FMA, or AVX-512). A bf16 build
 * multiplies bf16 pairs where the CPU has AVX512-BF16 (PAIRS below), on AMX tiles where it has those (AMX below).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PANEL 16
#define BLOCK 32
#define ROWS 6
#define KC 256 /* k's per chunk: a widened chunk is KC * 16 floats = 16 KiB */

/* A panel row (16 floats) is NV vectors of W floats: one on AVX-512, two elsewhere. vec: a vector loaded or stored
 * at any float's address; veca: one in registers. */
#if defined(__AVX512F__)
#include <immintrin.h>
#define W 16
typedef float vec __attribute__((vector_size(64), aligned(4)));
typedef float veca __attribute__((vector_size(64)));
typedef uint32_t uveca __attribute__((vector_size(64)));
/* W float16 at p, widened. */
static inline veca halves(const uint16_t *p) { return (veca)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
/* Vector h of a Q4 panel row whose 8 bytes are at p: byte j's low nibble is output j, its high nibble j + 8. */
static inline veca nibbles(const uint8_t *p, int h) {
    (void)h;
    int64_t bytes;
    memcpy(&bytes, p, sizeof bytes);
    const __m512i wide = _mm512_cvtepu8_epi32(_mm_set1_epi64x(bytes)); /* bytes 0..7, twice */
    const __m512i shifts = _mm512_set_epi32(4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0);
    return (veca)_mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(wide, shifts), _mm512_set1_epi32(15)));
}
/* W signed bytes at p, as floats. */
static inline veca signed_bytes(const int8_t *p) {
    return (veca)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
/* W bfloat16 at p, widened. */
static inline veca upper_halves(const uint16_t *p) {
    return (veca)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16);
}
#else
#define W 8
typedef float vec __attribute__((vector_size(32), aligned(4)));
typedef float veca __attribute__((vector_size(32)));
typedef uint32_t uveca __attribute__((vector_size(32)));
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
static inline veca halves(const uint16_t *p) { return (veca)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline veca nibbles(const uint8_t *p, int h) {
    const __m256i wide = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    return (veca)_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(wide, 4 * h), _mm256_set1_epi32(15)));
}
static inline veca signed_bytes(const int8_t *p) {
    return (veca)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline veca upper_halves(const uint16_t *p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return (veca)_mm256_slli_epi32(wide, 16);
}
#else
/* Plain C where the host lacks AVX2, F16C or FMA: the compiler vectorises what it can. */
static inline veca halves(const uint16_t *p) {
    veca v;
    for (int i = 0; i < W; ++i) {
        _Float16 f;
        memcpy(&f, p + i, sizeof f);
        v[i] = (float)f;
    }
    return v;
}
static inline veca nibbles(const uint8_t *p, int h) {
    veca v;
    for (int i = 0; i < W; ++i) v[i] = (float)((p[i] >> (4 * h)) & 15);
    return v;
}
static inline veca signed_bytes(const int8_t *p) {
    veca v;
    for (int i = 0; i < W; ++i) v[i] = (float)p[i];
    return v;
}
static inline veca upper_halves(const uint16_t *p) {
    veca v;
    for (int i = 0; i < W; ++i) {
        const uint32_t bits = (uint32_t)p[i] << 16;
        memcpy(&v[i], &bits, sizeof bits);
    }
    return v;
}
#endif
#endif
#define NV (PANEL / W)
/* A bf16 build on a CPU with AVX512-BF16 multiplies bf16 pairs (vdpbf16ps: two products, each exact in float32,
 * added to the float32 sum in turn, with denormals taken as zero): the weights are widened, then rounded to bf16
 * and interleaved by k pairs in scratch; the activations are read as they come. */
#if defined(ROUND_BF16) && defined(__AVX512BF16__) && defined(__AVX512BW__)
#define PAIRS 1
typedef uint16_t xelem;  /* an activation: bf16 */
typedef uint16_t selem;  /* a widened weight in scratch: bf16, k pairs interleaved */
#else
typedef float xelem;
typedef float selem;
#endif

/* Stores W widened weights at dst: as they are, or (-DROUND_BF16 without PAIRS) each rounded to bfloat16, to
 * nearest with ties to even (the weights are finite), in the register before the store. */
static inline void put(float *dst, veca v) {
#if defined(ROUND_BF16) && !defined(PAIRS)
    uveca bits = (uveca)v;
    bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
    v = (veca)bits;
#endif
    *(vec *)dst = v;
}

/* Each form: BLOCK_BYTES per 32 k's of a panel; `scales` reads what a block's rows share (for the k's of one half of
 * the block: Q8F's scales differ between them), `row` the W weights of vector h of row k (0..31) as floats. */
typedef struct {
    veca d[NV], m[NV];
} scales_t;
#if defined(FORM_Q4)
#define BLOCK_BYTES (PANEL * 2 * 2 + BLOCK * PANEL / 2)
static inline void scales(const uint8_t *block, int half, scales_t *s) {
    (void)half;
    for (int h = 0; h < NV; ++h)
        s->d[h] = halves((const uint16_t *)block + h * W), s->m[h] = halves((const uint16_t *)block + PANEL + h * W);
}
static inline veca row(const uint8_t *block, int k, int h, const scales_t *s) {
    return s->d[h] * nibbles(block + PANEL * 4 + k * 8, h) + s->m[h];
}
#elif defined(FORM_Q8)
#define BLOCK_BYTES (PANEL * 2 + BLOCK * PANEL)
static inline void scales(const uint8_t *block, int half, scales_t *s) {
    (void)half;
    for (int h = 0; h < NV; ++h) s->d[h] = halves((const uint16_t *)block + h * W);
}
static inline veca row(const uint8_t *block, int k, int h, const scales_t *s) {
    return s->d[h] * signed_bytes((const int8_t *)(block + PANEL * 2) + k * PANEL + h * W);
}
#elif defined(FORM_Q4F)
#define BLOCK_BYTES (PANEL * 4 * 2 + BLOCK * PANEL / 2)
static inline void scales(const uint8_t *block, int half, scales_t *s) {
    (void)half;
    const float *f = (const float *)block;
    for (int h = 0; h < NV; ++h) s->d[h] = *(const vec *)(f + h * W), s->m[h] = *(const vec *)(f + PANEL + h * W);
}
static inline veca row(const uint8_t *block, int k, int h, const scales_t *s) {
    return s->d[h] * nibbles(block + PANEL * 8 + k * 8, h) + s->m[h];
}
#elif defined(FORM_Q8F)
#define BLOCK_BYTES (PANEL * 4 * 2 + BLOCK * PANEL)
static inline void scales(const uint8_t *block, int half, scales_t *s) {
    for (int h = 0; h < NV; ++h) s->d[h] = *(const vec *)((const float *)block + half * PANEL + h * W);
}
static inline veca row(const uint8_t *block, int k, int h, const scales_t *s) {
    return s->d[h] * signed_bytes((const int8_t *)(block + PANEL * 8) + k * PANEL + h * W);
}
#elif defined(FORM_BF16)
#define BLOCK_BYTES (BLOCK * PANEL * 2)
static inline void scales(const uint8_t *block, int half, scales_t *s) {
    (void)block, (void)half, (void)s;
}
static inline veca row(const uint8_t *block, int k, int h, const scales_t *s) {
    (void)s;
    return upper_halves((const uint16_t *)block + k * PANEL + h * W);
}
#else
#error "build with -DFORM_Q4, -DFORM_Q8, -DFORM_Q4F, -DFORM_Q8F or -DFORM_BF16"
#endif

/* Asks for the block AHEAD blocks on (the next panel's, past a panel's end: they lie one after another) to be in
 * cache by the time it is widened: without it the widening waited on the weights' loads (the bundled model's 4-bit
 * layers in bf16 took 0.64x the time at 1 row, 0.74x at 16 with it; 4 or 8 blocks on did alike, 16 or 32 less). */
#define AHEAD 8
static inline void fetch_ahead(const uint8_t *block) {
    for (int i = 0; i < BLOCK_BYTES; i += 64) __builtin_prefetch(block + AHEAD * BLOCK_BYTES + i, 0, 3);
}

#ifndef PAIRS
/* Widens k's [k0, k0 + n) of one panel (k0 and n multiples of BLOCK) into out[n][16]. */
static void widen_chunk(const uint8_t *panel, int64_t k0, int64_t n, float *restrict out) {
    for (int64_t b = 0; b < n / BLOCK; ++b) {
        const uint8_t *block = panel + (k0 / BLOCK + b) * BLOCK_BYTES;
        float *dst = out + b * BLOCK * PANEL;
        fetch_ahead(block);
        for (int half = 0; half < 2; ++half) {
            scales_t s;
            scales(block, half, &s);
            for (int k = half * BLOCK / 2; k < (half + 1) * BLOCK / 2; ++k)
                for (int h = 0; h < NV; ++h) put(dst + k * PANEL + h * W, row(block, k, h, &s));
        }
    }
}
#endif

/* One row of a tile's result (NV vectors) at dst: stored, or added to what is there; columns >= cols untouched. */
static inline void store_row(float *dst, const veca *acc, int cols, int accumulate) {
    if (cols == PANEL) {
        for (int h = 0; h < NV; ++h) *(vec *)(dst + h * W) = accumulate ? *(vec *)(dst + h * W) + acc[h] : acc[h];
    } else {
        for (int j = 0; j < cols; ++j) dst[j] = (accumulate ? dst[j] : 0.0f) + acc[j / W][j % W];
    }
}

/* Partial sums per tile height: 8 accumulators or more where the rows alone make fewer. A multiply-add waits 4
 * cycles for the one before it on the same accumulator and two issue per cycle, so fewer than 8 leave the pipes
 * idle: small tiles keep U partial sums (k, k + 1, ...) and add them up at the end (U divides 16). */
#define U_FOR(R) ((R) * NV >= 8 ? 1 : (R) * NV >= 4 ? 2 : (R) * NV >= 2 ? 4 : 8)

#ifndef PAIRS
/* c[r][0..16) (+)= sum over k < n of a[r][k] * b[k][0..16) for the R rows r < R (R constant, so the
 * accumulators stay in registers); n is a multiple of 32. */
#define TILE(R, U)                                                                                                \
    static void tile_##R(const xelem *a, int64_t lda, const selem *restrict b, int64_t n, float *c, int64_t ldc, \
                         int cols, int accumulate) {                                                              \
        veca acc[U][R][NV];                                                                                       \
        for (int u = 0; u < U; ++u)                                                                               \
            for (int r = 0; r < R; ++r)                                                                           \
                for (int h = 0; h < NV; ++h) acc[u][r][h] = (veca){0};                                            \
        for (int64_t k = 0; k < n; k += U) {                                                                      \
            for (int u = 0; u < U; ++u) {                                                                         \
                const float *bk = b + (k + u) * PANEL;                                                            \
                veca bv[NV];                                                                                      \
                for (int h = 0; h < NV; ++h) bv[h] = *(const vec *)(bk + h * W);                                  \
                for (int r = 0; r < R; ++r) {                                                                     \
                    const float x = a[r * lda + k + u];                                                           \
                    for (int h = 0; h < NV; ++h) acc[u][r][h] += x * bv[h];                                       \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
        for (int u = 1; u < U; ++u)                                                                               \
            for (int r = 0; r < R; ++r)                                                                           \
                for (int h = 0; h < NV; ++h) acc[0][r][h] += acc[u][r][h];                                        \
        for (int r = 0; r < R; ++r) store_row(c + r * ldc, acc[0][r], cols, accumulate);                          \
    }
#else
/* The same over bf16 pairs: b holds k pair p as [p][j][2], a's rows are bf16, so one vdpbf16ps adds two k's. */
#define TILE(R, U)                                                                                                \
    static void tile_##R(const xelem *a, int64_t lda, const selem *restrict b, int64_t n, float *c, int64_t ldc, \
                         int cols, int accumulate) {                                                              \
        veca acc[U][R][1];                                                                                        \
        for (int u = 0; u < U; ++u)                                                                               \
            for (int r = 0; r < R; ++r) acc[u][r][0] = (veca){0};                                                 \
        for (int64_t k = 0; k < n; k += 2 * U) {                                                                  \
            for (int u = 0; u < U; ++u) {                                                                         \
                const __m512bh w = (__m512bh)_mm512_loadu_si512(b + (k + 2 * u) * PANEL);                         \
                for (int r = 0; r < R; ++r) {                                                                     \
                    uint32_t pair;                                                                                \
                    memcpy(&pair, a + r * lda + k + 2 * u, sizeof pair);                                          \
                    acc[u][r][0] = (veca)_mm512_dpbf16_ps((__m512)acc[u][r][0],                                   \
                                                          (__m512bh)_mm512_set1_epi32((int)pair), w);             \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
        for (int u = 1; u < U; ++u)                                                                               \
            for (int r = 0; r < R; ++r) acc[0][r][0] += acc[u][r][0];                                             \
        for (int r = 0; r < R; ++r) store_row(c + r * ldc, acc[0][r], cols, accumulate);                          \
    }

/* One block's 32 k's as 16 bf16 pairs (rounded to nearest, ties to even): out[p][j][2] holds the weights of k's
 * 2p and 2p + 1 for output j. */
#if defined(FORM_Q4) || defined(FORM_Q4F)
/* The 4-bit forms come out in pair order with no permute: rows k and k + 1 interleaved byte by byte put row k's byte
 * j at lane 2j and row k + 1's at 2j + 1, so the low nibbles are outputs 0..7's pairs and the high ones 8..15's, and
 * the scales are spread to match once a half (output j's at lanes 2j and 2j + 1). The same multiply-add and
 * rounding per weight as row(): the same bits (a quarter of a bf16 step of 16 rows was the permuting version). */
#if defined(FORM_Q4)
#define NIBBLE_ROWS (PANEL * 2 * 2)
#else
#define NIBBLE_ROWS (PANEL * 4 * 2)
#endif
static void pairs_of(const uint8_t *block, selem *restrict out) {
    const __m512i low = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m512i high = _mm512_add_epi32(low, _mm512_set1_epi32(8));
    const __m512i nibble = _mm512_set1_epi32(15);
    fetch_ahead(block);
    for (int half = 0; half < 2; ++half) {
        scales_t s;
        scales(block, half, &s);
        const __m512 d_low = _mm512_permutexvar_ps(low, (__m512)s.d[0]);
        const __m512 m_low = _mm512_permutexvar_ps(low, (__m512)s.m[0]);
        const __m512 d_high = _mm512_permutexvar_ps(high, (__m512)s.d[0]);
        const __m512 m_high = _mm512_permutexvar_ps(high, (__m512)s.m[0]);
        for (int k = half * BLOCK / 2; k < (half + 1) * BLOCK / 2; k += 2) {
            const uint8_t *rows = block + NIBBLE_ROWS + k * 8;
            const __m128i both = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)rows),
                                                   _mm_loadl_epi64((const __m128i *)(rows + 8)));
            const __m512i wide = _mm512_cvtepu8_epi32(both);
            const __m512 lo = _mm512_fmadd_ps(d_low, _mm512_cvtepi32_ps(_mm512_and_si512(wide, nibble)), m_low);
            const __m512 hi = _mm512_fmadd_ps(d_high, _mm512_cvtepi32_ps(_mm512_srli_epi32(wide, 4)), m_high);
            _mm512_storeu_si512(out + k * PANEL, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
}
#else
static void pairs_of(const uint8_t *block, selem *restrict out) {
    /* word 2j <- word j (k even), word 2j + 1 <- word 16 + j (k odd) */
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                                22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    fetch_ahead(block);
    for (int half = 0; half < 2; ++half) {
        scales_t s;
        scales(block, half, &s);
        for (int k = half * BLOCK / 2; k < (half + 1) * BLOCK / 2; k += 2) {
            const __m512 even = (__m512)row(block, k, 0, &s), odd = (__m512)row(block, k + 1, 0, &s);
            const __m512i pair = (__m512i)_mm512_cvtne2ps_pbh(odd, even); /* words 0..15 even, 16..31 odd */
            _mm512_storeu_si512(out + k * PANEL, _mm512_permutexvar_epi16(interleave, pair));
        }
    }
}
#endif

/* Widens k's [k0, k0 + n) of one panel into scratch as bf16 pairs. */
static void widen_chunk(const uint8_t *panel, int64_t k0, int64_t n, selem *restrict out) {
    for (int64_t b = 0; b < n / BLOCK; ++b) pairs_of(panel + (k0 / BLOCK + b) * BLOCK_BYTES, out + b * BLOCK * PANEL);
}
#endif
TILE(1, U_FOR(1))
TILE(2, U_FOR(2))
TILE(3, U_FOR(3))
TILE(4, U_FOR(4))
TILE(5, U_FOR(5))
TILE(6, U_FOR(6))

typedef void (*tile_fn)(const xelem *, int64_t, const selem *restrict, int64_t, float *, int64_t, int, int);
static const tile_fn TILES[ROWS + 1] = {NULL, tile_1, tile_2, tile_3, tile_4, tile_5, tile_6};

/* y = x W^T (+ bias): x [m][k] (row stride ldx), packed W (n outputs, k inputs; k a multiple of 32), bias [n] or
 * NULL, y [m][n] float32 (row stride ldy). 0 on success, 1 where scratch memory ran out. */
static int multiply(const xelem *x, int64_t ldx, const uint8_t *packed, const float *bias, float *y, int64_t ldy,
                    int64_t m, int64_t n, int64_t k, int threads) {
    const int64_t panels = (n + PANEL - 1) / PANEL;
    const int64_t panel_bytes = (k / BLOCK) * BLOCK_BYTES;
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        selem *scratch = aligned_alloc(64, sizeof(selem) * KC * PANEL);
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
                widen_chunk(packed + p * panel_bytes, k0, kn, scratch);
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

#ifndef ROUND_BF16
/* x [m][k] (row stride ldx), packed W (n outputs, k inputs; k a multiple of 32), bias [n] or NULL, y [m][n] (row
 * stride ldy), all float32. 0 on success, 1 where scratch memory ran out. */
int packed_linear(const float *x, int64_t ldx, const uint8_t *packed, const float *bias, float *y, int64_t ldy,
                  int64_t m, int64_t n, int64_t k, int threads) {
    return multiply(x, ldx, packed, bias, y, ldy, m, n, k, threads);
}
#else
/* A float rounded to bfloat16, to nearest with ties to even, as torch's cast rounds it (a NaN stays a NaN). */
static inline uint16_t to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((bits >> 16) | 0x40u);
    return (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

#if defined(PAIRS) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
/* With AMX (Intel's tile unit), the pairs of one block are one tile of weights (16 k pairs x 16 outputs) and 16
 * rows of activations x 32 k's another; a tile multiply (tdpbf16ps: vdpbf16ps's arithmetic over a k pair at a time)
 * adds their products into a 16 x 16 tile of float32 sums, one per 16 rows (tiles 0..5; 6: activations, 7: weights).
 * The activations are copied into rows padded to a multiple of 16 with zeros; the sums of a panel are stored once. */
#include <sys/syscall.h>
#include <unistd.h>
#define AMX 1
#define GROUP 16
#define GROUPS 6

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Whether the kernel lets this process use the tile registers (it must ask once; torch's oneDNN asks the same). */
static int amx_usable(void) {
    static int usable = -1;
    if (usable < 0) usable = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return usable;
}

#define EACH_GROUP(OP)      \
    do {                    \
        OP(0);              \
        if (groups > 1) OP(1); \
        if (groups > 2) OP(2); \
        if (groups > 3) OP(3); \
        if (groups > 4) OP(4); \
        if (groups > 5) OP(5); \
    } while (0)

/* sums[r][j] = the float32 sums of padded rows r < 16 * groups of xs ([16 * groups][k], bf16) times panel's outputs. */
static void amx_panel(const uint16_t *xs, int64_t k, int groups, const uint8_t *panel, uint16_t *pairs, float *sums) {
#define ZERO(g) _tile_zero(g)
#define ADD(g)                                                           \
    do {                                                                 \
        _tile_loadd(6, xs + (int64_t)(g) * GROUP * k + b * BLOCK, k * 2); \
        _tile_dpbf16ps(g, 6, 7);                                         \
    } while (0)
#define STORE(g) _tile_stored(g, sums + (g) * GROUP * PANEL, PANEL * 4)
    EACH_GROUP(ZERO);
    for (int64_t b = 0; b < k / BLOCK; ++b) {
        pairs_of(panel + b * BLOCK_BYTES, pairs);
        _tile_loadd(7, pairs, PANEL * 4);
        EACH_GROUP(ADD);
    }
    EACH_GROUP(STORE);
#undef ZERO
#undef ADD
#undef STORE
}

/* multiply() on the tile unit: sums [m][n] float32 (+ bias). 0 on success, 1 where memory ran out. */
static int amx_multiply(const uint16_t *x, int64_t ldx, const uint8_t *packed, const float *bias, float *sums,
                        int64_t m, int64_t n, int64_t k, int threads) {
    const int64_t panels = (n + PANEL - 1) / PANEL;
    const int64_t panel_bytes = (k / BLOCK) * BLOCK_BYTES;
    tile_config config = {.palette = 1};
    for (int t = 0; t < 8; ++t) config.colsb[t] = 64, config.rows[t] = 16;
    int failed = 0;
    for (int64_t r0 = 0; r0 < m && !failed; r0 += GROUP * GROUPS) {
        const int64_t rows = m - r0 < GROUP * GROUPS ? m - r0 : GROUP * GROUPS;
        const int groups = (int)((rows + GROUP - 1) / GROUP);
        uint16_t *xs = calloc((size_t)(groups * GROUP * k), sizeof(uint16_t));
        if (xs == NULL) return 1;
        for (int64_t r = 0; r < rows; ++r) memcpy(xs + r * k, x + (r0 + r) * ldx, sizeof(uint16_t) * k);
#pragma omp parallel num_threads(threads) if (threads > 1)
        {
            uint16_t *pairs = aligned_alloc(64, sizeof(uint16_t) * BLOCK * PANEL);
            float *tile_sums = aligned_alloc(64, sizeof(float) * GROUP * GROUPS * PANEL);
            if (pairs == NULL || tile_sums == NULL) {
#pragma omp atomic write
                failed = 1;
            } else {
                _tile_loadconfig(&config);
            }
#pragma omp for schedule(static)
            for (int64_t p = 0; p < panels; ++p) {
                if (pairs == NULL || tile_sums == NULL) continue;
                const int cols = n - p * PANEL < PANEL ? (int)(n - p * PANEL) : PANEL;
                amx_panel(xs, k, groups, packed + p * panel_bytes, pairs, tile_sums);
                for (int64_t r = 0; r < rows; ++r)
                    for (int j = 0; j < cols; ++j)
                        sums[(r0 + r) * n + p * PANEL + j] =
                            tile_sums[r * PANEL + j] + (bias != NULL ? bias[p * PANEL + j] : 0.0f);
            }
            if (pairs != NULL && tile_sums != NULL) _tile_release();
            free(pairs);
            free(tile_sums);
        }
        free(xs);
    }
    return failed;
}
#endif

/* For a model served in bfloat16: x [m][k] and y [m][n] bf16 (row strides ldx, ldy), the weights rounded to bf16
 * as they are widened, the sums float32 (bias [n] float32 included), each output rounded once at the end. Without
 * PAIRS the activations are widened into a float32 copy first. 0 on success, 1 where memory ran out. */
int packed_linear_bf16(const uint16_t *x, int64_t ldx, const uint8_t *packed, const float *bias, uint16_t *y,
                       int64_t ldy, int64_t m, int64_t n, int64_t k, int threads) {
    float *sums = malloc(sizeof(float) * (m * n + 1));
    if (sums == NULL) return 1;
#if defined(AMX)
    int failed = amx_usable() ? amx_multiply(x, ldx, packed, bias, sums, m, n, k, threads)
                              : multiply(x, ldx, packed, bias, sums, n, m, n, k, threads);
#elif defined(PAIRS)
    int failed = multiply(x, ldx, packed, bias, sums, n, m, n, k, threads);
#else
    float *wide = malloc(sizeof(float) * (m * k + 1));
    int failed = wide == NULL;
    if (!failed) {
        for (int64_t r = 0; r < m; ++r)
            for (int64_t i = 0; i < k; ++i) {
                const uint32_t bits = (uint32_t)x[r * ldx + i] << 16;
                memcpy(wide + r * k + i, &bits, sizeof bits);
            }
        failed = multiply(wide, k, packed, bias, sums, n, m, n, k, threads);
    }
    free(wide);
#endif
    if (!failed)
        for (int64_t r = 0; r < m; ++r)
            for (int64_t j = 0; j < n; ++j) y[r * ldy + j] = to_bf16(sums[r * n + j]);
    free(sums);
    return failed;
}
#endif
