// C++ test of the mixprec ops through the public header, against an
// installed libmixprec (find_package(mixprec)). CPU tensors; torch's own ops
// (and float64 math) are the references. Plain main, no test framework: the
// last line is "N passed, M failed" and the exit status is M != 0.
#include <mixprec/mixprec.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "check.h"

namespace {

// Bitwise equality of two tensors of the same floating dtype (NaN == NaN
// when the bits agree, -0 != +0).
bool bits_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || !a.sizes().equals(b.sizes())) {
    return false;
  }
  const auto as_int = [](const at::Tensor& t) {
    const at::Tensor c = t.contiguous();
    switch (c.element_size()) {
      case 2:
        return c.view(at::kShort);
      case 4:
        return c.view(at::kInt);
      default:
        return c.view(at::kLong);
    }
  };
  return at::equal(as_int(a), as_int(b));
}

std::vector<at::Tensor> clone_all(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) out.push_back(t.clone());
  return out;
}

at::Tensor scalar_f32(double v) { return at::full({1}, v, at::kFloat); }
at::Tensor scalar_i32(int64_t v) { return at::full({1}, v, at::kInt); }

// Random grads of several sizes (incl. empty, single, odd, > one chunk),
// spread over a wide exponent range, one strided.
std::vector<at::Tensor> random_grads(at::ScalarType dtype) {
  std::vector<at::Tensor> g;
  for (int64_t n : {0, 1, 7, 33, 1000, 70001}) {
    g.push_back((at::randn({n}, at::kDouble) *
                 at::exp2(at::randint(-8, 8, {n}, at::kDouble)))
                    .to(dtype));
  }
  g.push_back(at::randn({64, 48}, at::kDouble).to(dtype).t());  // strided
  return g;
}

// Writes v at flat (row-major) position `index` of g[which], strided or not.
void inject(std::vector<at::Tensor>& g, size_t which, int64_t index, double v) {
  at::Tensor elem = g[which];
  int64_t rest = index;
  std::vector<int64_t> idx(g[which].dim());
  for (int64_t d = g[which].dim() - 1; d >= 0; --d) {
    idx[d] = rest % g[which].size(d);
    rest /= g[which].size(d);
  }
  for (int64_t i : idx) elem = elem.select(0, i);
  elem.fill_(v);
}

void test_unscale_vs_torch(std::mt19937_64& rng) {
  for (at::ScalarType dtype : {at::kFloat, at::kHalf}) {
    for (int scenario = 0; scenario < 4; ++scenario) {
      std::vector<at::Tensor> a = random_grads(dtype);
      // scenario 0: all finite; 1: +inf first elem of first non-empty;
      // 2: NaN last elem of last; 3: -inf in the middle.
      if (scenario == 1)
        inject(a, 1, 0, std::numeric_limits<double>::infinity());
      if (scenario == 2)
        inject(a, a.size() - 1, a.back().numel() - 1, std::nan(""));
      if (scenario == 3)
        inject(a, 5, 12345, -std::numeric_limits<double>::infinity());
      std::vector<at::Tensor> b = clone_all(a);
      const double scale = std::ldexp(
          1.0 + std::uniform_real_distribution<double>(0, 1)(rng), 12);
      const at::Tensor inv = scalar_f32(static_cast<float>(1.0 / scale));
      at::Tensor found_a = scalar_f32(0.0), found_b = scalar_f32(0.0);
      mixprec::unscale_and_check_(a, found_a, inv);
      at::_amp_foreach_non_finite_check_and_unscale_(b, found_b, inv);
      const std::string tag = std::string(c10::toString(dtype)) + " scenario " +
                              std::to_string(scenario);
      CHECK_MSG(bits_equal(found_a, found_b), tag);
      CHECK_MSG(found_a.item<float>() == (scenario == 0 ? 0.0f : 1.0f), tag);
      bool all_equal = true;
      for (size_t i = 0; i < a.size(); ++i)
        all_equal = all_equal && bits_equal(a[i], b[i]);
      CHECK_MSG(all_equal, "grads differ from torch: " + tag);
    }
  }
  // found_inf already 1 stays 1 on clean data.
  std::vector<at::Tensor> g = random_grads(at::kFloat);
  at::Tensor found = scalar_f32(1.0);
  mixprec::unscale_and_check_(g, found, scalar_f32(0.5));
  CHECK(found.item<float>() == 1.0f);
}

void test_unscale_bf16() {
  for (double inv_d : {1.0 / 1024.0, 1.0 / 3000.0}) {
    std::vector<at::Tensor> g = random_grads(at::kBFloat16);
    inject(g, 4, 999, std::numeric_limits<double>::infinity());
    std::vector<at::Tensor> orig = clone_all(g);
    const float inv = static_cast<float>(inv_d);
    at::Tensor found = scalar_f32(0.0);
    mixprec::unscale_and_check_(g, found, scalar_f32(inv));
    CHECK(found.item<float>() == 1.0f);
    bool ok = true;
    for (size_t i = 0; i < g.size(); ++i) {
      const at::Tensor ref =
          (orig[i].to(at::kDouble) * static_cast<double>(inv));
      if (inv_d == 1.0 / 1024.0) {
        // Power-of-two factor: the product is exact, so bitwise.
        ok = ok && bits_equal(g[i], ref.to(at::kBFloat16));
      } else {
        // One bf16 rounding of the float32 product: within half an ulp of
        // bf16 plus float32 rounding; inf stays inf.
        const at::Tensor got = g[i].to(at::kDouble);
        const at::Tensor finite = at::isfinite(ref);
        ok = ok && at::equal(at::isfinite(got), finite);
        const at::Tensor err = (got - ref).abs().masked_fill(~finite, 0.0);
        const at::Tensor tol =
            ref.abs().masked_fill(~finite, 0.0) * std::ldexp(1.0, -8) + 1e-38;
        ok = ok && at::le(err, tol).all().item<bool>();
      }
    }
    CHECK_MSG(ok, "bf16 vs float64 reference, inv=" + std::to_string(inv_d));
  }
}

void test_check_finite() {
  for (at::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    std::vector<at::Tensor> t = random_grads(dtype);
    std::vector<at::Tensor> before = clone_all(t);
    at::Tensor found = scalar_f32(0.0);
    mixprec::check_finite_(t, found);
    CHECK(found.item<float>() == 0.0f);
    inject(t, 6, 17, std::nan(""));
    before = clone_all(t);
    mixprec::check_finite_(t, found);
    CHECK(found.item<float>() == 1.0f);
    bool untouched = true;
    for (size_t i = 0; i < t.size(); ++i)
      untouched = untouched && bits_equal(t[i], before[i]);
    CHECK_MSG(untouched, std::string("check_finite_ wrote its input, ") +
                             c10::toString(dtype));
  }
}

// The norm ops through the header: unscale_and_norm_ writes, the read-only
// twin does not, and both return the same norm (float64 reference within
// 1e-6; inv_scale a power of two, so grad * inv is exact).
void test_norm_ops() {
  for (at::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    std::vector<at::Tensor> t = random_grads(dtype);
    std::vector<at::Tensor> before = clone_all(t);
    std::vector<at::Tensor> parts;
    for (const auto& g : t) parts.push_back(g.to(at::kDouble).flatten() * 0.25);
    const double want = at::cat(parts).norm().item<double>();
    at::Tensor f1 = scalar_f32(0.0), f2 = scalar_f32(0.0);
    const at::Tensor n1 =
        mixprec::check_finite_and_norm_(t, f1, scalar_f32(0.25));
    bool untouched = true;
    for (size_t i = 0; i < t.size(); ++i)
      untouched = untouched && bits_equal(t[i], before[i]);
    CHECK_MSG(untouched, std::string("check_finite_and_norm_ wrote, ") +
                             c10::toString(dtype));
    const at::Tensor n2 = mixprec::unscale_and_norm_(t, f2, scalar_f32(0.25));
    CHECK(bits_equal(n1, n2));
    CHECK_MSG(
        std::abs(n1.item<double>() - want) <= 1e-6 * want,
        std::to_string(n1.item<double>()) + " vs " + std::to_string(want));
    CHECK(f1.item<float>() == 0.0f && f2.item<float>() == 0.0f);
    CHECK(!bits_equal(t[5], before[5]));  // unscaled in place
  }
}

struct State {
  at::Tensor scale, tracker, hyst, found;
};

void test_update_scale() {
  // scale 4, growth 2, backoff 0.25, interval 2: no-inf, no-inf, inf.
  at::Tensor scale = scalar_f32(4.0), tracker = scalar_i32(0);
  at::Tensor ts = scale.clone(), tt = tracker.clone();  // torch's op as control
  const float infs[] = {0.0f, 0.0f, 1.0f};
  const float want_scale[] = {4.0f, 8.0f, 2.0f};
  const int want_tracker[] = {1, 0, 0};
  for (int step = 0; step < 3; ++step) {
    const at::Tensor found = scalar_f32(infs[step]);
    mixprec::update_scale_(scale, tracker, found, 2.0, 0.25, 2);
    at::_amp_update_scale_(ts, tt, found, 2.0, 0.25, 2);
    const std::string tag = "step " + std::to_string(step);
    CHECK_MSG(scale.item<float>() == want_scale[step], tag);
    CHECK_MSG(tracker.item<int>() == want_tracker[step], tag);
    CHECK_MSG(bits_equal(scale, ts) && at::equal(tracker, tt),
              "differs from torch, " + tag);
  }
  // counts and prev_scale: the same sequence counted by the same kernel
  // (updates, overflowed, grown, shrunk, index of the last overflow).
  at::Tensor cs = scalar_f32(4.0), ct = scalar_i32(0);
  at::Tensor counts = at::tensor({0, 0, 0, 0, -1}, at::kLong);
  at::Tensor prev = scalar_f32(4.0);
  const int64_t want_counts[3][5] = {
      {1, 0, 0, 0, -1}, {2, 0, 1, 0, -1}, {3, 1, 1, 1, 2}};
  for (int step = 0; step < 3; ++step) {
    mixprec::update_scale_(cs, ct, scalar_f32(infs[step]), 2.0, 0.25, 2, counts,
                           prev);
    const std::string tag = "counted step " + std::to_string(step);
    CHECK_MSG(cs.item<float>() == want_scale[step], tag);
    CHECK_MSG(prev.item<float>() == want_scale[step], tag);
    for (int k = 0; k < 5; ++k) {
      CHECK_MSG(counts[k].item<int64_t>() == want_counts[step][k],
                tag + ", counts[" + std::to_string(k) + "]");
    }
  }
  // Growth skipped when the grown scale would overflow float32.
  at::Tensor big = scalar_f32(1e38), tr = scalar_i32(0);
  mixprec::update_scale_(big, tr, scalar_f32(0.0), 16.0, 0.5, 1);
  CHECK(big.item<float>() == 1e38f);
  CHECK(tr.item<int>() == 0);
}

void step_ext(State& s, float inf, double growth, double backoff,
              int64_t interval, std::optional<double> min_s,
              std::optional<double> max_s, int64_t hyst) {
  s.found.fill_(inf);
  mixprec::update_scale_ext_(s.scale, s.tracker, s.hyst, s.found, growth,
                             backoff, interval, min_s, max_s, hyst);
}

State make_state(double scale, int64_t hyst) {
  return State{scalar_f32(scale), scalar_i32(0), scalar_i32(hyst),
               scalar_f32(0.0)};
}

void test_update_scale_ext() {
  {  // hysteresis 2: the first overflow is absorbed, the second backs off,
     // a completed growth interval refills it.
    State s = make_state(4.0, 2);
    const float infs[] = {1, 1, 0, 0, 1};
    const float want_scale[] = {4, 2, 2, 4, 4};
    const int want_hyst[] = {1, 0, 0, 2, 1};
    const int want_tracker[] = {0, 0, 1, 0, 0};
    for (int i = 0; i < 5; ++i) {
      step_ext(s, infs[i], 2.0, 0.5, 2, std::nullopt, std::nullopt, 2);
      const std::string tag = "hysteresis step " + std::to_string(i);
      CHECK_MSG(s.scale.item<float>() == want_scale[i], tag);
      CHECK_MSG(s.hyst.item<int>() == want_hyst[i], tag);
      CHECK_MSG(s.tracker.item<int>() == want_tracker[i], tag);
    }
  }
  {  // min_scale floors the backoff.
    State s = make_state(4.0, 1);
    step_ext(s, 1, 2.0, 0.25, 2, 2.0, std::nullopt, 1);
    CHECK(s.scale.item<float>() == 2.0f);
    step_ext(s, 1, 2.0, 0.25, 2, 2.0, std::nullopt, 1);
    CHECK(s.scale.item<float>() == 2.0f);
  }
  {  // max_scale caps the growth.
    State s = make_state(4.0, 1);
    step_ext(s, 0, 2.0, 0.5, 1, std::nullopt, 6.0, 1);
    CHECK(s.scale.item<float>() == 6.0f);
    step_ext(s, 0, 2.0, 0.5, 1, std::nullopt, 6.0, 1);
    CHECK(s.scale.item<float>() == 6.0f);
  }
  {  // hysteresis 1, no bounds == update_scale_ on a random sequence.
    State s = make_state(1024.0, 1);
    at::Tensor scale = scalar_f32(1024.0), tracker = scalar_i32(0);
    const at::Tensor pattern = at::rand({40}, at::kDouble);
    bool same = true;
    for (int64_t i = 0; i < pattern.numel(); ++i) {
      const float inf = pattern[i].item<double>() < 0.3 ? 1.0f : 0.0f;
      step_ext(s, inf, 2.0, 0.5, 3, std::nullopt, std::nullopt, 1);
      mixprec::update_scale_(scale, tracker, scalar_f32(inf), 2.0, 0.5, 3);
      same =
          same && bits_equal(s.scale, scale) && at::equal(s.tracker, tracker);
    }
    CHECK_MSG(same,
              "update_scale_ext_(hysteresis=1) differs from update_scale_");
  }
}

void test_bad_inputs() {
  std::vector<at::Tensor> g = random_grads(at::kFloat);
  const std::vector<at::Tensor> before = clone_all(g);
  const at::Tensor inv = scalar_f32(0.5);
  at::Tensor found_f64 = at::zeros({1}, at::kDouble);
  CHECK_THROWS(c10::Error, mixprec::unscale_and_check_(g, found_f64, inv),
               "found_inf");
  at::Tensor found = scalar_f32(0.0);
  at::Tensor inv_2 = at::full({2}, 0.5, at::kFloat);
  CHECK_THROWS(c10::Error, mixprec::unscale_and_check_(g, found, inv_2),
               "inv_scale");
  std::vector<at::Tensor> with_int = clone_all(g);
  with_int.push_back(at::ones({3}, at::kInt));
  CHECK_THROWS(c10::Error, mixprec::unscale_and_check_(with_int, found, inv),
               "grads[");
  bool untouched = found.item<float>() == 0.0f;
  for (size_t i = 0; i < g.size(); ++i)
    untouched = untouched && bits_equal(g[i], before[i]);
  CHECK_MSG(untouched, "a rejected call modified its inputs");

  State s = make_state(4.0, 1);
  CHECK_THROWS(c10::Error,
               step_ext(s, 0, 0.5, 0.5, 2, std::nullopt, std::nullopt, 1),
               "growth_factor");
  CHECK_THROWS(c10::Error,
               step_ext(s, 0, 2.0, 1.5, 2, std::nullopt, std::nullopt, 1),
               "backoff_factor");
  CHECK(s.scale.item<float>() == 4.0f);
  at::Tensor tracker_f = at::zeros({1}, at::kFloat);
  at::Tensor scale = scalar_f32(4.0);
  CHECK_THROWS(c10::Error,
               mixprec::update_scale_(scale, tracker_f, found, 2.0, 0.5, 2),
               "growth_tracker");
}

// Per-block |max| of a float tensor in row-major order (blocks of 256).
at::Tensor block_absmax(const at::Tensor& x) {
  const int64_t n = x.numel();
  const int64_t blocks = (n + 255) / 256;
  at::Tensor flat = at::zeros({blocks * 256}, at::kFloat);
  flat.narrow(0, 0, n).copy_(x.reshape({-1}).abs());
  return std::get<0>(flat.view({blocks, 256}).max(1));
}

// The 8-bit ops from a zero state (codes of zeros, absmax 0) against the
// 32-bit ops from zero moments: the param update uses the unquantized new
// moments, so params and masters are bitwise the 32-bit op's, and each
// block's new absmax is the 32-bit op's moment's |max| there.
void test_fused8() {
  const std::vector<int64_t> sizes = {1, 255, 256, 700, 70001};
  std::vector<at::Tensor> p32, p8, g, m32, v32, m8, ma, v8, va, mp32, mp8, s32,
      s8;
  for (int64_t n : sizes) {
    p32.push_back(at::randn({n}).to(at::kHalf));
    p8.push_back(p32.back().clone());
    g.push_back(at::randn({n}).to(at::kBFloat16));
    m32.push_back(at::zeros({n}));
    v32.push_back(at::zeros({n}));
    m8.push_back(at::full({n}, 127, at::kByte));  // signed zero code
    v8.push_back(at::zeros({n}, at::kByte));      // unsigned zero code
    ma.push_back(at::zeros({(n + 255) / 256}));
    va.push_back(at::zeros({(n + 255) / 256}));
    mp32.push_back(p32.back().to(at::kFloat));
    mp8.push_back(mp32.back().clone());
    s32.push_back(at::zeros({1}));
    s8.push_back(at::zeros({1}));
  }
  const at::Tensor lr = at::full({1}, 1e-2, at::kFloat);
  const at::Tensor scale = scalar_f32(64.0);
  mixprec::fused_adam_(p32, g, m32, v32, {}, mp32, s32, lr, /*beta1=*/0.9,
                       /*beta2=*/0.999, /*weight_decay=*/0.01, /*eps=*/1e-8,
                       /*amsgrad=*/false, /*maximize=*/false,
                       /*decoupled_weight_decay=*/true, scale);
  mixprec::fused_adam8_(p8, g, m8, ma, v8, va, mp8, s8, lr, /*beta1=*/0.9,
                        /*beta2=*/0.999, /*weight_decay=*/0.01, /*eps=*/1e-8,
                        /*maximize=*/false, /*decoupled_weight_decay=*/true,
                        scale);
  for (size_t i = 0; i < sizes.size(); ++i) {
    CHECK_MSG(bits_equal(p8[i], p32[i]), "param " + std::to_string(i));
    CHECK_MSG(bits_equal(mp8[i], mp32[i]), "master " + std::to_string(i));
    CHECK_MSG(bits_equal(ma[i], block_absmax(m32[i])),
              "exp_avg_absmax " + std::to_string(i));
    CHECK_MSG(bits_equal(va[i], block_absmax(v32[i])),
              "exp_avg_sq_absmax " + std::to_string(i));
    CHECK(s8[i].item<float>() == 1.0f);
  }
  // fused_sgd8_ at a first step: the buffer is the gradient, and a
  // gradient whose block maximum is exactly 1 has the code of +1 (255) there.
  at::Tensor gp = at::rand({512}) * 0.5;
  gp.index_put_({0}, 1.0);
  gp.index_put_({300}, 1.0);
  std::vector<at::Tensor> sp{at::zeros({512})}, sb{at::zeros({512}, at::kByte)},
      sa{at::zeros({2})}, ss{at::zeros({1})};
  mixprec::fused_sgd8_(sp, {gp}, sb, sa, {}, ss, lr, /*weight_decay=*/0.0,
                       /*momentum=*/0.9, /*dampening=*/0.0,
                       /*nesterov=*/false, /*maximize=*/false);
  CHECK(sa[0][0].item<float>() == 1.0f && sa[0][1].item<float>() == 1.0f);
  CHECK(sb[0][0].item<int>() == 255 && sb[0][300].item<int>() == 255);
  // a bad call names the argument and changes nothing
  std::vector<at::Tensor> short_absmax{at::zeros({1})};
  const at::Tensor before = sp[0].clone();
  CHECK_THROWS(c10::Error,
               mixprec::fused_sgd8_(sp, {gp}, sb, short_absmax, {}, ss, lr, 0.0,
                                    0.9, 0.0, false, false),
               "momentum_absmax[0]");
  CHECK_THROWS(c10::Error,
               mixprec::fused_sgd8_(sp, {gp}, sb, sa, {}, ss, lr, 0.0,
                                    /*momentum=*/0.0, 0.0, false, false),
               "momentum");
  CHECK(bits_equal(sp[0], before));
}

void test_build_info() {
  const mixprec::BuildInfo info = mixprec::build_info();
  std::printf(
      "build_info: mixprec %s, torch %s, cuda kernels %s, CUDA '%s', archs "
      "'%s'\n",
      info.version.c_str(), info.torch_version.c_str(),
      info.cuda_kernels ? "yes" : "no", info.cuda_version.c_str(),
      info.cuda_archs.c_str());
  CHECK(info.version == MIXPREC_EXPECTED_VERSION);
  // Built against this torch: "2.14.1+cu130" starts with TORCH_VERSION
  // "2.14.1".
  CHECK_MSG(info.torch_version.rfind(TORCH_VERSION, 0) == 0,
            info.torch_version + " vs " + TORCH_VERSION);
  CHECK(info.cuda_kernels == (MIXPREC_EXPECTED_CUDA_KERNELS != 0));
  CHECK(info.cuda_kernels == !info.cuda_version.empty());
  CHECK(info.cuda_kernels == !info.cuda_archs.empty());
}

}  // namespace

int main() {
  std::random_device rd;
  const uint64_t seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  at::manual_seed(seed);
  std::mt19937_64 rng(seed);

  const mixprec_test::TestList tests = {
      {"unscale_and_check_ vs torch (fp32, fp16)",
       [&] { test_unscale_vs_torch(rng); }},
      {"unscale_and_check_ bf16 vs float64", test_unscale_bf16},
      {"check_finite_", test_check_finite},
      {"unscale_and_norm_ / check_finite_and_norm_", test_norm_ops},
      {"update_scale_", test_update_scale},
      {"update_scale_ext_", test_update_scale_ext},
      {"bad inputs", test_bad_inputs},
      {"fused_adam8_ / fused_sgd8_ vs the 32-bit ops", test_fused8},
      {"build_info", test_build_info},
  };
  return mixprec_test::run_tests(tests);
}
