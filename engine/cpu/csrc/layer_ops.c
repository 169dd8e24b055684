/* The elementwise work of a Llama-family decoder layer in float32, one call each, for engine/model/forward.py:
 * the residual add with RMSNorm, rotary embedding with the K/V writes into the paged pool, and SiLU(gate) * up.
 *
 * Each follows transformers' own arithmetic step by step (built with -ffp-contract=off, so a product and a sum
 * round separately as torch's separate kernels do), so the engine's greedy tokens stay those of transformers'
 * generate; only a norm's sum of squares is added in another order, and SiLU's e^x is computed here (within
 * 3.7e-7 relative, as torch's own vectorised one is within 2.6e-7).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* residual (+)= h, then out = weight * (residual / sqrt(mean(residual^2) + eps)), per row of dim floats; with
 * first set, the residual starts as h (the embeddings). Rows of h, residual and out are contiguous. */
void add_rms_norm(const float *h, float *residual, const float *weight, float eps, int64_t rows, int64_t dim,
                  int first, float *out) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *hr = h + r * dim;
        float *res = residual + r * dim, *o = out + r * dim;
        if (first) {
            memcpy(res, hr, sizeof(float) * (size_t)dim);
        } else {
            for (int64_t i = 0; i < dim; ++i) res[i] += hr[i];
        }
        float squares = 0.0f;
        for (int64_t i = 0; i < dim; ++i) squares += res[i] * res[i];
        const float scale = 1.0f / sqrtf(squares / (float)dim + eps);
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
        for (int64_t h = 0; h < kv_heads; ++h) {
            const size_t bytes = sizeof(float) * (size_t)head_dim;
            memcpy(k_cache + (h * num_slots + slot) * head_dim, k + t * ldk + h * head_dim, bytes);
            memcpy(v_cache + (h * num_slots + slot) * head_dim, v + t * ldv + h * head_dim, bytes);
        }
    }
    return failed;
}

/* float to bfloat16, rounded to nearest even (as torch's .to(torch.bfloat16)); scales are finite and positive. */
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
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

/* gate = SiLU(gate) * up, SiLU(x) = x / (1 + e^-x), over rows of width floats (row strides ldg, ldu). Eight at a
 * time where the host has AVX2 and FMA (torch's SiLU is vectorised too, its e^x within one ulp). */
void silu_mul(float *gate, int64_t ldg, const float *up, int64_t ldu, int64_t rows, int64_t width) {
    for (int64_t r = 0; r < rows; ++r) {
        float *g = gate + r * ldg;
        const float *u = up + r * ldu;
        int64_t i = 0;
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
