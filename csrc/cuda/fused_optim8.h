// The block functor of the fused optimizers with block-wise 8-bit state
// (fused_adam8_ in fused_adam.h, fused_sgd8_ in fused_sgd.h), on the plans
// and launcher of fused_optim.h.
//
// A state block (up to q8::kBlock = 256 elements of one row, one absmax;
// q8::RowBlocks) needs the new values of all its elements before any code can
// be written, so the functor is warp-cooperative (WarpRounds, launch_plan.h):
// one warp owns one state block per round, each lane up to 8 of its elements
// (two runs of 4: elements 4l..4l+3 and 128+4l..128+4l+3, so a warp's loads
// are contiguous). The plan runs over kBlock slots per state block (so every
// CUDA block starts at a state block: launch_optim's row slot), and the
// functor maps its rounds to the blocks' elements with the row length that
// travels in the Rule's kRow slot. Phase 1 reads the
// codes back with the old absmax, runs the optimizer's element update, writes
// the param (and master) and keeps the new state values in registers, with
// their per-lane |max|; the warp takes the maximum; phase 2 writes the codes
// of the new values against it, and lane 0 the new absmax. The element math
// is the CPU kernel's (common/optim_math.h, common/quant8_math.h).
#pragma once

#include <cstdint>

#include "common/optim_math.h"
#include "common/quant8_math.h"
#include "cuda/fused_optim.h"

namespace mixprec {
namespace cuda {

static_assert(kChunkSize % q8::kBlock == 0,
              "every CUDA block must start at an 8-bit state block");
static_assert(q8::kBlock == 2 * kOptVec * kWarpSize,
              "a lane owns two runs of kOptVec elements of a state block");

// Rule supplies what OptimOp's Rule does (fused_optim.h), with kStates 8-bit
// states: codes_slot(k), absmax_slot(k) and table(k) (q8::kSigned or
// q8::kUnsigned) instead of state_slot / uses_state, and the slots kRow and
// kSrBase (integers, not addresses: launch_optim writes them).
template <typename P, typename G, bool kHasMaster, class Rule>
struct Optim8Op {
  static constexpr int kStates = Rule::kStates;
  static constexpr int kWarpMaxes = kStates;
  static constexpr int kRuns = 2;  // runs of kOptVec elements per lane
  using Args = typename Rule::Args;

  struct Lane {
    float x[kStates][kRuns][kOptVec];
  };

  template <class Meta>
  MIXPREC_HD int rounds(const Meta& meta, int block, const Args& a) const {
    if (a.found_inf != nullptr && *a.found_inf != 0.0f) {
      return 0;
    }
    const BlockSpan s = block_span(meta, block);
    return static_cast<int>((s.length + q8::kBlock - 1) / q8::kBlock);
  }

  // The first element (in its state block) of run j of `lane`.
  MIXPREC_HD static int64_t run_start(int j, int lane) {
    return j * (kOptVec * kWarpSize) + kOptVec * lane;
  }

  // How many of the kOptVec elements from i0 lie in a block of `length`.
  MIXPREC_HD static int run_count(int64_t i0, int64_t length) {
    const int64_t rest = length - i0;
    return rest <= 0 ? 0 : (rest < kOptVec ? static_cast<int>(rest) : kOptVec);
  }

  // The state block of `round` in this CUDA block: its number qb, first
  // element and length.
  struct StateBlock {
    int64_t qb;
    int64_t start;
    int64_t length;
  };
  template <class Meta>
  MIXPREC_HD static StateBlock state_block(const Meta& meta, const BlockSpan& s,
                                           int round) {
    const q8::RowBlocks rb(static_cast<int64_t>(
        reinterpret_cast<uintptr_t>(meta.addresses[Rule::kRow][s.tensor])));
    const int64_t qb = s.start / q8::kBlock + round;
    return StateBlock{qb, rb.start(qb), rb.length(qb)};
  }

  template <class Meta>
  MIXPREC_HD void phase1(const Meta& meta, GridPos pos, int round, int lane,
                         Lane& st, float (&maxes)[kStates],
                         const Args& a) const {
    const BlockSpan s = block_span(meta, pos.block);
    const StateBlock sb = state_block(meta, s, round);
    const auto [unused, p, g, mp, blk, load_states, gc, key, base] =
        StepFrame<P, G, kHasMaster, Rule>::make(meta, pos, a, sb.start);
    auto list = [&](int slot) { return meta.addresses[slot][s.tensor]; };
    const uint8_t* codes[kStates];
    float old_max[kStates];
#pragma unroll
    for (int k = 0; k < kStates; ++k) {
      codes[k] =
          static_cast<const uint8_t*>(list(Rule::codes_slot(k))) + sb.start;
      old_max[k] = static_cast<const float*>(list(Rule::absmax_slot(k)))[sb.qb];
      maxes[k] = 0.0f;
    }
    const bool aligned = vec_aligned<P>(p) && vec_aligned<G>(g) &&
                         (!kHasMaster || vec_aligned<float>(mp));
#pragma unroll
    for (int j = 0; j < kRuns; ++j) {
      const int64_t i0 = run_start(j, lane);
      const int count = run_count(i0, sb.length);
      float w[kOptVec] = {};
      float gr[kOptVec] = {};
      if (count == kOptVec && aligned) {
        const int64_t vi = i0 / kOptVec;
        if constexpr (kHasMaster) {
          load_vec(mp, vi, w);
        } else {
          load_vec(p, vi, w);
        }
        load_vec(g, vi, gr);
      } else {
        for (int e = 0; e < count; ++e) {
          w[e] = kHasMaster ? mp[i0 + e] : static_cast<float>(p[i0 + e]);
          gr[e] = static_cast<float>(g[i0 + e]);
        }
      }
      for (int e = 0; e < count; ++e) {
        float x[kStates];
#pragma unroll
        for (int k = 0; k < kStates; ++k) {
          x[k] = load_states
                     ? q8::decode(codes[k][i0 + e], old_max[k], Rule::table(k))
                     : 0.0f;
        }
        Rule::update(w[e], math::prepare_grad(gr[e], gc), x, a, blk);
#pragma unroll
        for (int k = 0; k < kStates; ++k) {
          st.x[k][j][e] = x[k];
          maxes[k] = q8::abs_max(maxes[k], x[k]);
        }
      }
      if (count == kOptVec && aligned) {
        const int64_t vi = i0 / kOptVec;
        if constexpr (kHasMaster) {
          store_vec(mp, vi, w);
        }
        AlignedVector<P, kOptVec> out;
#pragma unroll
        for (int e = 0; e < kOptVec; ++e) {
          out.val[e] = round_param<P>(w[e], a.sr, key,
                                      base + static_cast<uint32_t>(i0 + e));
        }
        reinterpret_cast<AlignedVector<P, kOptVec>*>(p)[vi] = out;
      } else {
        for (int e = 0; e < count; ++e) {
          if constexpr (kHasMaster) {
            mp[i0 + e] = w[e];
          }
          p[i0 + e] = round_param<P>(w[e], a.sr, key,
                                     base + static_cast<uint32_t>(i0 + e));
        }
      }
    }
  }

  template <class Meta>
  MIXPREC_HD void phase2(const Meta& meta, GridPos pos, int round, int lane,
                         const Lane& st, const float (&maxes)[kStates],
                         const Args&) const {
    const BlockSpan s = block_span(meta, pos.block);
    const StateBlock sb = state_block(meta, s, round);
    auto list = [&](int slot) { return meta.addresses[slot][s.tensor]; };
#pragma unroll
    for (int k = 0; k < kStates; ++k) {
      uint8_t* codes =
          static_cast<uint8_t*>(list(Rule::codes_slot(k))) + sb.start;
      const bool aligned4 = reinterpret_cast<uintptr_t>(codes) % kOptVec == 0;
#pragma unroll
      for (int j = 0; j < kRuns; ++j) {
        const int64_t i0 = run_start(j, lane);
        const int count = run_count(i0, sb.length);
        if (count == kOptVec && aligned4) {
          AlignedVector<uint8_t, kOptVec> out;
#pragma unroll
          for (int e = 0; e < kOptVec; ++e) {
            out.val[e] = q8::encode(st.x[k][j][e], maxes[k], Rule::table(k));
          }
          reinterpret_cast<AlignedVector<uint8_t, kOptVec>*>(
              codes)[i0 / kOptVec] = out;
        } else {
          for (int e = 0; e < count; ++e) {
            codes[i0 + e] = q8::encode(st.x[k][j][e], maxes[k], Rule::table(k));
          }
        }
      }
      if (lane == 0) {
        static_cast<float*>(list(Rule::absmax_slot(k)))[sb.qb] = maxes[k];
      }
    }
  }
};

}  // namespace cuda
}  // namespace mixprec
