// Element math of the fused optimizers (fused_adam_, fused_sgd_), shared by
// the CPU and CUDA kernels. No ATen types.
//
// The update functions are templates over the value type V and an `Ops`
// policy giving sqrt and a NaN-propagating maximum for V, so the same
// expressions serve a scalar float on the host, a float in a CUDA kernel and
// simd::FVec in the CPU loop (csrc/cpu/simd.h; the policy lives in
// csrc/cpu/fused_optim_span_impl.h).
//
// The order of operations is torch.optim's single-tensor (foreach=False) CPU
// path, operation by operation, each product/sum rounded to float once
// (builds use -ffp-contract=off / --fmad=false, so nothing is fused):
//
//   Adam / AdamW, per element (t = the step count after the increment):
//     g  = grad * inv_scale [* clip_coef]        (when given, in that order)
//     g  = -g                                    (maximize)
//     p  = p * (1 - lr*wd)                       (AdamW, wd != 0)
//     g  = g + wd * p                            (Adam, wd != 0)
//     m  = lerp(m, g, 1 - beta1)                 (torch's two-sided lerp)
//     v  = v * beta2 + ((1 - beta2) * g) * g
//     vm = max(vm, v)                            (amsgrad; NaN propagates)
//     d  = sqrt(amsgrad ? vm : v) / sqrt(1 - beta2^t) + eps
//     p  = p + (-(lr / (1 - beta1^t)) * m) / d
//   where the scalars in parentheses are computed in double and rounded to
//   float once (as Python floats become float32 scalars in torch's kernels).
//
//   SGD, per element:
//     g  = grad * inv_scale [* clip_coef]; g = -g (maximize)
//     g  = g + wd * p                            (wd != 0)
//     b  = first step ? g : b * momentum + (1 - dampening) * g  (momentum != 0)
//     g  = nesterov ? g + momentum * b : b       (momentum != 0)
//     p  = p + (-lr) * g
//
// Stochastic rounding (bf16 params without masters): the float result is
// rounded to bfloat16 by adding 16 random bits below the kept mantissa and
// truncating, which rounds up with probability equal to the discarded
// fraction (unbiased). The bits come from a counter-based hash of
// (seed, step, stream, element key), so a run is reproducible and a resumed
// run draws the same bits as an uninterrupted one.
#pragma once

#include <torch/headeronly/macros/Macros.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace mixprec {
namespace math {

// sqrt and NaN-propagating max for scalar float/double, host and device.
struct ScalarOps {
  template <typename T>
  C10_HOST_DEVICE C10_ALWAYS_INLINE static T sqrt(T v) {
#ifdef __CUDA_ARCH__
    return ::sqrt(v);
#else
    return std::sqrt(v);
#endif
  }
  // torch.maximum: NaN if either operand is NaN.
  template <typename T>
  C10_HOST_DEVICE C10_ALWAYS_INLINE static T maximum(T a, T b) {
    return (a != a) ? a : ((b != b) ? b : (a > b ? a : b));
  }
};

C10_HOST_DEVICE C10_ALWAYS_INLINE double pow_d(double b, double e) {
#ifdef __CUDA_ARCH__
  return ::pow(b, e);
#else
  return std::pow(b, e);
#endif
}

C10_HOST_DEVICE C10_ALWAYS_INLINE double sqrt_d(double v) {
#ifdef __CUDA_ARCH__
  return ::sqrt(v);
#else
  return std::sqrt(v);
#endif
}

// ---------------------------------------------------------------------------
// Gradient preparation, shared by both families.

struct GradCoefs {
  float inv_scale;  // 1 / grad_scale (float64 reciprocal rounded to float)
  float clip;       // clip coefficient
  bool has_scale;
  bool has_clip;
  bool maximize;
};

// torch: 1 / scale taken in double, rounded to float.
C10_HOST_DEVICE C10_ALWAYS_INLINE float reciprocal_scale(float scale) {
  return static_cast<float>(1.0 / static_cast<double>(scale));
}

// The coefficients of a call from its one-element grad_scale and clip_coef
// (null when not given), read where they live: on the host in the CPU
// kernels, on the device in the CUDA kernels.
C10_HOST_DEVICE C10_ALWAYS_INLINE GradCoefs make_grad_coefs(
    const float* grad_scale, const float* clip_coef, bool maximize) {
  GradCoefs gc{1.0f, 1.0f, grad_scale != nullptr, clip_coef != nullptr,
               maximize};
  if (gc.has_scale) {
    gc.inv_scale = reciprocal_scale(*grad_scale);
  }
  if (gc.has_clip) {
    gc.clip = *clip_coef;
  }
  return gc;
}

template <typename V>
C10_HOST_DEVICE C10_ALWAYS_INLINE V prepare_grad(V g, const GradCoefs& c) {
  if (c.has_scale) {
    g = g * V(c.inv_scale);
  }
  if (c.has_clip) {
    g = g * V(c.clip);
  }
  if (c.maximize) {
    g = g * V(-1.0f);  // exact negation, as torch's -grad
  }
  return g;
}

// ---------------------------------------------------------------------------
// Adam / AdamW.

// Scalars that depend only on the call (not on the step count).
struct AdamConsts {
  float lerp_w;           // float(1 - beta1)
  float lerp_one_minus;   // 1.0f - lerp_w (torch's large-weight branch)
  bool lerp_small;        // |lerp_w| < 0.5
  float beta2;            // float(beta2)
  float one_minus_beta2;  // float(1 - beta2)
  float eps;              // float(eps)
  float wd;               // float(weight_decay)
  bool has_wd;            // weight_decay != 0
  bool decoupled;         // AdamW
};

C10_HOST_DEVICE C10_ALWAYS_INLINE AdamConsts
make_adam_consts(double beta1, double beta2, double weight_decay, double eps,
                 bool decoupled) {
  AdamConsts k;
  k.lerp_w = static_cast<float>(1.0 - beta1);
  k.lerp_one_minus = 1.0f - k.lerp_w;
  k.lerp_small = (k.lerp_w < 0 ? -k.lerp_w : k.lerp_w) < 0.5f;
  k.beta2 = static_cast<float>(beta2);
  k.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  k.eps = static_cast<float>(eps);
  k.wd = static_cast<float>(weight_decay);
  k.has_wd = weight_decay != 0.0;
  k.decoupled = decoupled;
  return k;
}

// Scalars of one tensor's step: t = step count after the increment.
struct AdamStep {
  float decay;          // float(1 - lr * wd)             (AdamW)
  float neg_step_size;  // float(-(lr / (1 - beta1^t)))
  float bc2_sqrt;       // float(sqrt(1 - beta2^t))
};

C10_HOST_DEVICE C10_ALWAYS_INLINE AdamStep make_adam_step(
    double lr, double beta1, double beta2, double weight_decay, double t) {
  AdamStep s;
  s.decay = static_cast<float>(1.0 - lr * weight_decay);
  const double bc1 = 1.0 - pow_d(beta1, t);
  const double bc2 = 1.0 - pow_d(beta2, t);
  s.neg_step_size = static_cast<float>(-(lr / bc1));
  s.bc2_sqrt = static_cast<float>(sqrt_d(bc2));
  return s;
}

// One Adam/AdamW update of (p, m, v[, vmax]) given the prepared gradient g.
// p is the float32 working copy (the master, or the param in float).
template <bool kAmsgrad, typename Ops, typename V>
C10_HOST_DEVICE C10_ALWAYS_INLINE void adam_update(V& p, V g, V& m, V& v,
                                                   V& vmax, const AdamConsts& k,
                                                   const AdamStep& s) {
  if (k.has_wd) {
    if (k.decoupled) {
      p = p * V(s.decay);
    } else {
      g = g + V(k.wd) * p;
    }
  }
  if (k.lerp_small) {
    m = m + V(k.lerp_w) * (g - m);
  } else {
    m = g - (g - m) * V(k.lerp_one_minus);
  }
  v = v * V(k.beta2);
  v = v + V(k.one_minus_beta2) * g * g;
  V vhat = v;
  if constexpr (kAmsgrad) {
    vmax = Ops::maximum(vmax, v);
    vhat = vmax;
  }
  const V denom = Ops::sqrt(vhat) / V(s.bc2_sqrt) + V(k.eps);
  p = p + V(s.neg_step_size) * m / denom;
}

// ---------------------------------------------------------------------------
// SGD.

struct SgdConsts {
  float wd;              // float(weight_decay)
  float momentum;        // float(momentum)
  float one_minus_damp;  // float(1 - dampening)
  bool has_wd;
  bool has_momentum;
  bool nesterov;
};

C10_HOST_DEVICE C10_ALWAYS_INLINE SgdConsts make_sgd_consts(double weight_decay,
                                                            double momentum,
                                                            double dampening,
                                                            bool nesterov) {
  SgdConsts k;
  k.wd = static_cast<float>(weight_decay);
  k.momentum = static_cast<float>(momentum);
  k.one_minus_damp = static_cast<float>(1.0 - dampening);
  k.has_wd = weight_decay != 0.0;
  k.has_momentum = momentum != 0.0;
  k.nesterov = nesterov;
  return k;
}

// One SGD update of p (and buf when momentum != 0). `first` is true on the
// first real step (buf then starts as a copy of g, as torch's does).
template <typename V>
C10_HOST_DEVICE C10_ALWAYS_INLINE void sgd_update(V& p, V g, V& buf,
                                                  const SgdConsts& k,
                                                  bool first, float neg_lr) {
  if (k.has_wd) {
    g = g + V(k.wd) * p;
  }
  if (k.has_momentum) {
    if (first) {
      buf = g;
    } else {
      buf = buf * V(k.momentum);
      buf = buf + V(k.one_minus_damp) * g;
    }
    if (k.nesterov) {
      g = g + V(k.momentum) * buf;
    } else {
      g = buf;
    }
  }
  p = p + V(neg_lr) * g;
}

// ---------------------------------------------------------------------------
// Counter-based random bits and stochastic rounding to bfloat16.

// A 32-bit integer finaliser with full avalanche (every input bit flips every
// output bit with probability ~1/2).
C10_HOST_DEVICE C10_ALWAYS_INLINE uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x21f0aaadu;
  x ^= x >> 15;
  x *= 0x735a2d97u;
  x ^= x >> 15;
  return x;
}

// The key of one (seed, step, stream) triple: hashed once per tensor/chunk.
C10_HOST_DEVICE C10_ALWAYS_INLINE uint32_t sr_key(uint64_t seed, uint32_t step,
                                                  uint32_t stream) {
  uint32_t h = mix32(static_cast<uint32_t>(seed) ^ 0x9e3779b9u);
  h = mix32(h ^ static_cast<uint32_t>(seed >> 32));
  h = mix32(h ^ step);
  h = mix32(h ^ stream);
  return h;
}

// 32 random bits for element `index` (< 2^32 per stream) under `key`.
C10_HOST_DEVICE C10_ALWAYS_INLINE uint32_t sr_bits(uint32_t key,
                                                   uint32_t index) {
  return mix32(mix32(index ^ key) + key);
}

C10_HOST_DEVICE C10_ALWAYS_INLINE uint32_t float_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

C10_HOST_DEVICE C10_ALWAYS_INLINE float float_from_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// The bfloat16 bits of x rounded stochastically with 16 random bits `r`.
// inf and NaN are passed through by truncation (NaN stays NaN: a quiet bit is
// forced, as round-to-nearest conversions do).
C10_HOST_DEVICE C10_ALWAYS_INLINE uint16_t bf16_bits_stochastic(float x,
                                                                uint32_t r) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7f800000u) == 0x7f800000u) {  // inf or NaN
    const bool nan = (u & 0x007fffffu) != 0;
    return static_cast<uint16_t>((u >> 16) | (nan ? 0x0040u : 0u));
  }
  return static_cast<uint16_t>((u + (r & 0xffffu)) >> 16);
}

// SR element keys: element e of a tensor gets index chunk_base * 65536 + e,
// where chunk_base counts the 65536-element chunks of the tensors before it
// in its (param dtype, grad dtype) group, in list order. The stream is the
// grad dtype's code. CPU and CUDA use the same numbering, so both draw the
// same bits for the same element.
constexpr int64_t kSrChunk = 65536;

}  // namespace math
}  // namespace mixprec
