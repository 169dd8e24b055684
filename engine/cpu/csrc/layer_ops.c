/* The elementwise work of a Llama-family decoder layer in float32, one call each, for engine/model/forward.py:
 * the residual add with RMSNorm, rotary embedding with the K/V writes into the paged pool, and SiLU(gate) * up.
 *
 * Each follows transformers' own arithmetic step by step (built with -ffp-contract=off, so a product and a sum
 * round separately as torch's separate kernels do), so the engine's greedy tokens stay those of transformers'
 * generate, bit for bit but for SiLU's e^x, computed here (within 3.7e-7 relative, as torch's own vectorised one
 * is within 2.6e-7). A norm's sum of squares is added in the order torch's CPU sum adds a row (torch_row_sum).
 *
 * The same operations where the model computes in bfloat16 end the file (the _bf16 functions): torch computes each
 * bf16 operation in float32 and rounds its result to bfloat16 once, so they round where each of torch's operations
 * does (a norm's float32 steps, a rotation's product and sum, SiLU and the product with up, each rounded).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* float to bfloat16, rounded to nearest even, a NaN kept a quiet NaN (as torch's .to(torch.bfloat16)). */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float from_bf16(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* f rounded to bfloat16 and widened again: what torch keeps of a bf16 operation's float32 result. */
static inline float bf16(float f) { return from_bf16(to_bf16(f)); }

typedef float floats8 __attribute__((vector_size(32), aligned(4)));

/* s[0] + ... + s[n - 1] in the order torch's CPU sum adds a contiguous float32 row (cascade_sum in
 * aten/src/ATen/native/cpu/SumKernel.cpp): vectors of 8 floats taken four at a time into four accumulators, each a
 * cascade of four levels that carries every 2^power vectors up a level (power = max(4, ceil(log2(groups)) / 4)),
 * the vectors left over added to the first accumulator, the other three added to it in turn, then the floats past
 * the last whole vector and the first accumulator's eight lanes, left to right, onto zero. Checked against
 * torch.sum in tests/engine/test_cpu_forward.py: the same bits at every width tried. */
static float torch_row_sum(const float *s, int64_t n) {
    const int64_t vectors = n / 8, groups = vectors / 4;
    int64_t ceil_log2 = 1;
    while (groups > 2 && (INT64_C(1) << ceil_log2) < groups) ++ceil_log2;
    const int64_t power = ceil_log2 / 4 > 4 ? ceil_log2 / 4 : 4, step = INT64_C(1) << power, mask = step - 1;
    floats8 acc[4][4];
    memset(acc, 0, sizeof acc);
    int64_t i = 0;
    while (i + step <= groups) {
        for (int64_t j = 0; j < step; ++j, ++i)
            for (int k = 0; k < 4; ++k) acc[0][k] += *(const floats8 *)(s + (i * 4 + k) * 8);
        for (int level = 1; level < 4; ++level) {
            for (int k = 0; k < 4; ++k) {
                acc[level][k] += acc[level - 1][k];
                acc[level - 1][k] = (floats8){0};
            }
            if ((i & (mask << (level * power))) != 0) break;
        }
    }
    for (; i < groups; ++i)
        for (int k = 0; k < 4; ++k) acc[0][k] += *(const floats8 *)(s + (i * 4 + k) * 8);
    for (int level = 1; level < 4; ++level)
        for (int k = 0; k < 4; ++k) acc[0][k] += acc[level][k];
    floats8 first = acc[0][0];
    for (int64_t v = groups * 4; v < vectors; ++v) first += *(const floats8 *)(s + v * 8);
    for (int k = 1; k < 4; ++k) first += acc[0][k];
    float total = 0.0f;
    for (int64_t j = vectors * 8; j < n; ++j) total += s[j];
    for (int lane = 0; lane < 8; ++lane) total += first[lane];
    return total;
}

/* 1 / sqrt(mean(x^2) + eps) of a row of n floats, as transformers' RMSNorm: x.pow(2) (each square rounded), its mean
 * (torch's sum, then divided by n), plus eps, torch.rsqrt (a square root, then a division). squares: n floats of
 * scratch. */
static float rms_scale(const float *x, int64_t n, float eps, float *squares) {
    for (int64_t i = 0; i < n; ++i) squares[i] = x[i] * x[i];
    return 1.0f / sqrtf(torch_row_sum(squares, n) / (float)n + eps);
}

/* residual (+)= h, then out = weight * (residual / sqrt(mean(residual^2) + eps)), per row of dim floats; with
 * first set, the residual starts as h (the embeddings). Rows of h, residual and out are contiguous. */
void add_rms_norm(const float *h, float *residual, const float *weight, float eps, int64_t rows, int64_t dim,
                  int first, float *out) {
    float squares[dim];
    for (int64_t r = 0; r < rows; ++r) {
        const float *hr = h + r * dim;
        float *res = residual + r * dim, *o = out + r * dim;
        if (first) {
            memcpy(res, hr, sizeof(float) * (size_t)dim);
        } else {
            for (int64_t i = 0; i < dim; ++i) res[i] += hr[i];
        }
        const float scale = rms_scale(res, dim, eps, squares);
        for (int64_t i = 0; i < dim; ++i) o[i] = weight[i] * (res[i] * scale);
    }
}

/* x[i] * cos[i] + rotate_half(x)[i] * sin[i] over one head of head_dim floats, in place. */
static void rotate(float *x, const float *cos, const float *sin, int64_t head_dim) {
    const int64_t half = head_dim / 2;
    for (int64_t i = 0; i < half; ++i) {
        const float a = x[i], b = x[i + half];
        x[i] = a * cos[i] + (-b) * sin[i];
        x[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

/* Token t's query heads (q, row stride ldq) and key heads (k, ldk) rotated in place by cos[t], sin[t] (rows of
 * head_dim). */
static void rotate_token(float *q, int64_t ldq, float *k, int64_t ldk, const float *cos, const float *sin, int64_t t,
                         int64_t heads, int64_t kv_heads, int64_t head_dim) {
    const float *c = cos + t * head_dim, *s = sin + t * head_dim;
    for (int64_t h = 0; h < heads; ++h) rotate(q + t * ldq + h * head_dim, c, s, head_dim);
    for (int64_t h = 0; h < kv_heads; ++h) rotate(k + t * ldk + h * head_dim, c, s, head_dim);
}

/* Every token rotated as rotate_token does, nothing stored (a pool in a form the caller writes itself). */
void rope(float *q, int64_t ldq, float *k, int64_t ldk, const float *cos, const float *sin, int64_t tokens,
          int64_t heads, int64_t kv_heads, int64_t head_dim) {
    for (int64_t t = 0; t < tokens; ++t) rotate_token(q, ldq, k, ldk, cos, sin, t, heads, kv_heads, head_dim);
}

/* One token's key and value rows (each kv_heads rows of `row` bytes) into pool slot `slot` of every KV head's cache
 * ([kv_heads][num_slots][row bytes]), whatever the element type. */
static void store_token(void *k_cache, void *v_cache, const void *k, const void *v, int64_t kv_heads, int64_t num_slots,
                        int64_t slot, size_t row) {
    for (int64_t h = 0; h < kv_heads; ++h) {
        memcpy((char *)k_cache + (size_t)(h * num_slots + slot) * row, (const char *)k + (size_t)h * row, row);
        memcpy((char *)v_cache + (size_t)(h * num_slots + slot) * row, (const char *)v + (size_t)h * row, row);
    }
}

/* Each token rotated (rotate_token); its keys and values (v, ldv) then written to pool slot slots[t] of every KV
 * head's cache ([kv_heads][num_slots][head_dim]). 0 on success; 2 where a slot lies outside the pool (nothing of
 * that token is written). */
int rope_and_store(float *q, int64_t ldq, float *k, int64_t ldk, const float *v, int64_t ldv, const float *cos,
                   const float *sin, const int64_t *slots, int64_t tokens, int64_t heads, int64_t kv_heads,
                   int64_t head_dim, float *k_cache, float *v_cache, int64_t num_slots) {
    int failed = 0;
    for (int64_t t = 0; t < tokens; ++t) {
        rotate_token(q, ldq, k, ldk, cos, sin, t, heads, kv_heads, head_dim);
        const int64_t slot = slots[t];
        if (slot < 0 || slot >= num_slots) {
            failed = 2;
            continue;
        }
        store_token(k_cache, v_cache, k + t * ldk, v + t * ldv, kv_heads, num_slots, slot, head_dim * sizeof(float));
    }
    return failed;
}


/* One row of head_dim floats as int8 codes and a bf16 scale, as engine.model.kv_cache.quantize computes them:
 * scale = bf16(max(max|x| / 127, FLT_MIN)), code = round-half-even(clamp(x / scale, -127, 127)). */
static void quantize_row(const float *x, int64_t head_dim, int8_t *codes, uint16_t *scale) {
    float top = 0.0f;
    for (int64_t i = 0; i < head_dim; ++i) top = fabsf(x[i]) > top ? fabsf(x[i]) : top;
    float step = top / 127.0f;
    step = step < 1.17549435e-38f ? 1.17549435e-38f : step;
    const uint16_t rounded = to_bf16(step);
    const uint32_t bits = (uint32_t)rounded << 16;
    memcpy(&step, &bits, sizeof step);
    for (int64_t i = 0; i < head_dim; ++i) {
        float c = x[i] / step;
        c = c > 127.0f ? 127.0f : c < -127.0f ? -127.0f : c;
        codes[i] = (int8_t)nearbyintf(c);
    }
    *scale = rounded;
}

/* x H in place, H the n x n Walsh-Hadamard matrix of +-1, n a power of two: the fast transform's butterflies, in
 * the order engine.model.kv_cache.rotate computes them (sums and differences are exact, so the bits agree). */
static void hadamard(float *x, int64_t n) {
    for (int64_t h = 1; h < n; h *= 2)
        for (int64_t i = 0; i < n; i += 2 * h)
            for (int64_t j = i; j < i + h; ++j) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
}

/* rope_and_store into an int8 pool (engine.model.kv_cache): each token's key rows rotated (hadamard, where head_dim
 * is a power of two up to 256), and its key and value rows quantized into
 * k_cache / v_cache ([kv_heads][num_slots][head_dim] int8) with their scales in k_scale / v_scale
 * ([kv_heads][num_slots] bf16). Returns as rope_and_store does. */
int rope_and_store_int8(float *q, int64_t ldq, float *k, int64_t ldk, const float *v, int64_t ldv, const float *cos,
                        const float *sin, const int64_t *slots, int64_t tokens, int64_t heads, int64_t kv_heads,
                        int64_t head_dim, int8_t *k_cache, int8_t *v_cache, uint16_t *k_scale, uint16_t *v_scale,
                        int64_t num_slots) {
    int failed = 0;
    for (int64_t t = 0; t < tokens; ++t) {
        rotate_token(q, ldq, k, ldk, cos, sin, t, heads, kv_heads, head_dim);
        const int64_t slot = slots[t];
        if (slot < 0 || slot >= num_slots) {
            failed = 2;
            continue;
        }
        for (int64_t h = 0; h < kv_heads; ++h) {
            const int64_t at = h * num_slots + slot;
            float rotated[256];
            const float *key = k + t * ldk + h * head_dim;
            if (head_dim <= 256 && (head_dim & (head_dim - 1)) == 0) {
                memcpy(rotated, key, sizeof(float) * (size_t)head_dim);
                hadamard(rotated, head_dim);
                key = rotated;
            }
            quantize_row(key, head_dim, k_cache + at * head_dim, k_scale + at);
            quantize_row(v + t * ldv + h * head_dim, head_dim, v_cache + at * head_dim, v_scale + at);
        }
    }
    return failed;
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
/* e^t for eight floats, within two ulps of expf: t = n ln2 + r (ln2 in two parts), e^r by Cephes' degree-7
 * polynomial, times 2^n. t above 88.376 gives infinity (e^t would be within a factor 1.5 of FLT_MAX, and SiLU
 * divides by it: 0 either way), t below -87.3 gives e^-87.3 (1 + e^t is then 1 either way). */
static inline __m256 exp8(__m256 t) {
    const __m256 high = _mm256_set1_ps(88.3762626647949f);
    const __m256 over = _mm256_cmp_ps(t, high, _CMP_GT_OQ);
    t = _mm256_max_ps(_mm256_min_ps(t, high), _mm256_set1_ps(-87.3f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(t, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), t);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
    return _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY), over);
}
#endif
#if defined(__AVX512F__)
#include <immintrin.h>
/* exp8's operations, in the same order, on sixteen lanes: the same bits (a bf16 prefill of 464 tokens spent a tenth
 * of its time in SiLU(gate) * up at eight lanes, 1.45x torch's own time for the two operations). */
static inline __m512 exp16(__m512 t) {
    const __m512 high = _mm512_set1_ps(88.3762626647949f);
    const __mmask16 over = _mm512_cmp_ps_mask(t, high, _CMP_GT_OQ);
    t = _mm512_max_ps(_mm512_min_ps(t, high), _mm512_set1_ps(-87.3f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(t, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), t);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i scale = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    const __m512 e = _mm512_mul_ps(p, _mm512_castsi512_ps(scale));
    return _mm512_mask_blend_ps(over, e, _mm512_set1_ps(INFINITY));
}
#endif

/* gate = SiLU(gate) * up, SiLU(x) = x / (1 + e^-x), over rows of width floats (row strides ldg, ldu). Eight at a
 * time where the host has AVX2 and FMA (torch's SiLU is vectorised too, its e^x within one ulp). */
void silu_mul(float *gate, int64_t ldg, const float *up, int64_t ldu, int64_t rows, int64_t width) {
    for (int64_t r = 0; r < rows; ++r) {
        float *g = gate + r * ldg;
        const float *u = up + r * ldu;
        int64_t i = 0;
#if defined(__AVX512F__)
        for (; i + 16 <= width; i += 16) {
            const __m512 x = _mm512_loadu_ps(g + i);
            const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
            const __m512 s = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
            _mm512_storeu_ps(g + i, _mm512_mul_ps(s, _mm512_loadu_ps(u + i)));
        }
#endif
#if defined(__AVX2__) && defined(__FMA__)
        for (; i + 8 <= width; i += 8) {
            const __m256 x = _mm256_loadu_ps(g + i);
            const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
            const __m256 s = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
            _mm256_storeu_ps(g + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
        }
#endif
        for (; i < width; ++i) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* ---- bfloat16: arrays of uint16_t holding bfloat16 values; each result rounded where torch rounds it. ---- */

/* add_rms_norm where the model is bf16: residual = bf16(residual + h); out = bf16(weight * bf16(residual * rsqrt)),
 * the norm in float32 as transformers' RMSNorm computes it. */
void add_rms_norm_bf16(const uint16_t *h, uint16_t *residual, const uint16_t *weight, float eps, int64_t rows,
                       int64_t dim, int first, uint16_t *out) {
    float wide[dim], squares[dim];
    for (int64_t r = 0; r < rows; ++r) {
        const uint16_t *hr = h + r * dim;
        uint16_t *res = residual + r * dim, *o = out + r * dim;
        if (first) {
            memcpy(res, hr, sizeof(uint16_t) * (size_t)dim);
        } else {
            for (int64_t i = 0; i < dim; ++i) res[i] = to_bf16(from_bf16(res[i]) + from_bf16(hr[i]));
        }
        for (int64_t i = 0; i < dim; ++i) wide[i] = from_bf16(res[i]);
        const float scale = rms_scale(wide, dim, eps, squares);
        for (int64_t i = 0; i < dim; ++i) o[i] = to_bf16(from_bf16(weight[i]) * bf16(wide[i] * scale));
    }
}

/* rotate over bf16: bf16(bf16(x * cos) + bf16(rotate_half(x) * sin)), as transformers' apply_rotary_pos_emb. */
static void rotate_bf16(uint16_t *x, const uint16_t *cos, const uint16_t *sin, int64_t head_dim) {
    const int64_t half = head_dim / 2;
    for (int64_t i = 0; i < half; ++i) {
        const float a = from_bf16(x[i]), b = from_bf16(x[i + half]);
        x[i] = to_bf16(bf16(a * from_bf16(cos[i])) + bf16(-b * from_bf16(sin[i])));
        x[i + half] = to_bf16(bf16(b * from_bf16(cos[i + half])) + bf16(a * from_bf16(sin[i + half])));
    }
}

static void rotate_token_bf16(uint16_t *q, int64_t ldq, uint16_t *k, int64_t ldk, const uint16_t *cos,
                              const uint16_t *sin, int64_t t, int64_t heads, int64_t kv_heads, int64_t head_dim) {
    const uint16_t *c = cos + t * head_dim, *s = sin + t * head_dim;
    for (int64_t h = 0; h < heads; ++h) rotate_bf16(q + t * ldq + h * head_dim, c, s, head_dim);
    for (int64_t h = 0; h < kv_heads; ++h) rotate_bf16(k + t * ldk + h * head_dim, c, s, head_dim);
}

void rope_bf16(uint16_t *q, int64_t ldq, uint16_t *k, int64_t ldk, const uint16_t *cos, const uint16_t *sin,
               int64_t tokens, int64_t heads, int64_t kv_heads, int64_t head_dim) {
    for (int64_t t = 0; t < tokens; ++t) rotate_token_bf16(q, ldq, k, ldk, cos, sin, t, heads, kv_heads, head_dim);
}

/* rope_and_store into a bf16 pool. Returns as rope_and_store does. */
int rope_and_store_bf16(uint16_t *q, int64_t ldq, uint16_t *k, int64_t ldk, const uint16_t *v, int64_t ldv,
                        const uint16_t *cos, const uint16_t *sin, const int64_t *slots, int64_t tokens, int64_t heads,
                        int64_t kv_heads, int64_t head_dim, uint16_t *k_cache, uint16_t *v_cache, int64_t num_slots) {
    int failed = 0;
    for (int64_t t = 0; t < tokens; ++t) {
        rotate_token_bf16(q, ldq, k, ldk, cos, sin, t, heads, kv_heads, head_dim);
        const int64_t slot = slots[t];
        if (slot < 0 || slot >= num_slots) {
            failed = 2;
            continue;
        }
        store_token(k_cache, v_cache, k + t * ldk, v + t * ldv, kv_heads, num_slots, slot, head_dim * sizeof(uint16_t));
    }
    return failed;
}

#if defined(__AVX2__) && defined(__FMA__)
static inline __m256 widen8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
/* Eight floats rounded to bfloat16 as to_bf16 does, in the upper halves of the lanes (the lower halves zero). */
static inline __m256i round8(__m256 f) {
    const __m256i u = _mm256_castps_si256(f);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
    const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
    return _mm256_and_si256(_mm256_blendv_epi8(rounded, quiet, nan), _mm256_set1_epi32((int)0xffff0000u));
}
static inline void store8(uint16_t *p, __m256i upper) {
    const __m256i low = _mm256_srli_epi32(upper, 16);
    _mm_storeu_si128((__m128i *)p, _mm_packus_epi32(_mm256_castsi256_si128(low), _mm256_extracti128_si256(low, 1)));
}
#endif
#if defined(__AVX512F__)
static inline __m512 widen16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
static inline __m512i round16(__m512 f) {
    const __m512i u = _mm512_castps_si512(f);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
    const __m512i quiet = _mm512_or_si512(u, _mm512_set1_epi32(0x400000));
    return _mm512_and_si512(_mm512_mask_blend_epi32(nan, rounded, quiet), _mm512_set1_epi32((int)0xffff0000u));
}
static inline void store16(uint16_t *p, __m512i upper) {
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(upper, 16)));
}
#endif

/* silu_mul where the model is bf16: gate = bf16(bf16(SiLU(gate)) * up). */
void silu_mul_bf16(uint16_t *gate, int64_t ldg, const uint16_t *up, int64_t ldu, int64_t rows, int64_t width) {
    for (int64_t r = 0; r < rows; ++r) {
        uint16_t *g = gate + r * ldg;
        const uint16_t *u = up + r * ldu;
        int64_t i = 0;
#if defined(__AVX512F__)
        for (; i + 16 <= width; i += 16) {
            const __m512 x = widen16(g + i);
            const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
            const __m512 s = _mm512_castsi512_ps(round16(_mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e))));
            store16(g + i, round16(_mm512_mul_ps(s, widen16(u + i))));
        }
#endif
#if defined(__AVX2__) && defined(__FMA__)
        for (; i + 8 <= width; i += 8) {
            const __m256 x = widen8(g + i);
            const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
            const __m256 s = _mm256_castsi256_ps(round8(_mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e))));
            store8(g + i, round8(_mm256_mul_ps(s, widen8(u + i))));
        }
#endif
        for (; i < width; ++i) {
            const float x = from_bf16(g[i]);
            g[i] = to_bf16(bf16(x / (1.0f + expf(-x))) * from_bf16(u[i]));
        }
    }
}
