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
// plan block starts at a state block: launch_optim's row slot), and the
// functor maps its rounds to the blocks' elements with the row length that
// travels in the Rule's kRow slot. load() reads a round's weights, grads,
// code words and old maxima (the executor issues it a round ahead); phase 1
// reads the codes back with the old absmax, runs the optimizer's element
// update, writes the param (and master) and keeps the new state values in
// registers, with their per-lane |max|; the warp takes the maximum; phase 2
// writes the codes of the new values against it, and lane 0 the new absmax.
// The code tables are read from the CUDA block's shared copy (Shared, staged
// by stage()). The element math is the CPU kernel's (common/optim_math.h,
// common/quant8_math.h).
#pragma once

#include <cstdint>

#include "common/optim_math.h"
#include "common/quant8_math.h"
#include "cuda/fused_optim.h"

namespace mixprec {
namespace cuda {

static_assert(kChunkSize % q8::kBlock == 0,
              "every plan block must start at an 8-bit state block");
static_assert(q8::kBlock == 2 * kOptVec * kWarpSize,
              "a lane owns two runs of kOptVec elements of a state block");

// Rule supplies what OptimOp's Rule does (fused_optim.h), with kStates 8-bit
// states: codes_slot(k), absmax_slot(k) and table(k) (q8::kSigned or
// q8::kUnsigned) instead of state_slot / uses_state, and the slots kRow and
// kSrBase (integers, not addresses: launch_optim writes them).
//
// Where the work is done: the step's constants, the tensor's pointers and the
// row-block geometry once per thread per plan block (Cursor, made by
// cursor()), the state block of each round by increment (advance()); the code
// tables read where the executor staged them (Shared: a CUDA block's shared
// memory, staged once per CUDA block of the persistent grid); a round's
// loads (load(), into In) issued during the round before it, after its
// phase 1; addresses by pointer arithmetic (no signed division); a whole,
// aligned state block (kBlock elements, every list aligned: every block of a
// tensor whose rows are multiples of kBlock) takes a fully unrolled path with
// 16-byte param/grad/master loads and its codes as 32-bit words; any other
// block the same unrolled code with per-element predicates and scalar
// accesses. Every loop index is a compile-time constant, so a lane's values
// stay in registers. Both paths run the same element operations in the same
// order, so the bits do not depend on the path. M: the masters, as OptimOp's.
template <typename P, typename G, typename M, class Rule>
struct Optim8Op {
  static constexpr int kStates = Rule::kStates;
  static constexpr int kWarpMaxes = kStates;
  static constexpr int kRuns = 2;  // runs of kOptVec elements per lane
  using Args = typename Rule::Args;
  using Shared = q8::SharedTables;

  // What a round reads (load()): the float32 weights (master or param) and
  // grads of the lane's runs, its code words and the block's old maxima.
  struct In {
    float w[kRuns][kOptVec];
    float g[kRuns][kOptVec];
    uint32_t words[kStates][kRuns];
    float old_max[kStates];
  };

  struct Lane {
    float x[kStates][kRuns][kOptVec];
  };

  // Thread `thread` of `threads`' share of staging the code tables.
  MIXPREC_HD static void stage(Shared& s, int thread, int threads) {
    q8::stage_tables(s, thread, threads);
  }

  // What a thread keeps across its rounds of one CUDA block: the tensor's
  // lists at element 0, the step's constants, and the state block of its
  // current round (number qb, first element `start`, `length`), with that
  // block's place in its row (row, col) for the increment.
  struct Cursor {
    P* p;
    const G* g;
    M* mp;  // null without a master
    const uint8_t* codes[kStates];
    float* absmax[kStates];
    q8::Tables tables;  // where the code tables are read
    typename Rule::Block blk;
    bool load_states;
    bool lists_aligned;  // params, grads, masters 16-byte aligned, codes 4
    math::GradCoefs gc;
    uint32_t key;
    uint32_t sr_base;  // the SR number of the tensor's element 0
    int rounds;
    int stride;         // rounds between two of this thread's rounds
    int64_t row;        // elements per row of the state
    int64_t per_row;    // state blocks per row
    int64_t block_row;  // the current block's row and column (in blocks)
    int64_t block_col;
    int64_t qb;
    int64_t start;
    int64_t length;
  };

  // Sets the current block's first element and length from (block_row,
  // block_col).
  MIXPREC_HD static void place(Cursor& c) {
    c.start = c.block_row * c.row + c.block_col * q8::kBlock;
    const int64_t rest = c.row - c.block_col * q8::kBlock;
    c.length = rest < q8::kBlock ? rest : q8::kBlock;
  }

  // The cursor of a thread whose first round is `first` and which takes
  // every `stride`-th round after it.
  template <class Meta>
  MIXPREC_HD Cursor cursor(const Meta& meta, int block, int first, int stride,
                           const Shared& shared, const Args& a) const {
    Cursor c;
    c.stride = stride;
    c.tables = q8::Tables::of(shared);
    const BlockSpan s = block_span(meta, block);
    // (every field is set on both sides of the found_inf test: no pointer is
    // null on one path, which would cost the device its global loads)
    c.rounds = a.found_inf != nullptr && *a.found_inf != 0.0f
                   ? 0
                   : static_cast<int>((s.length + q8::kBlock - 1) / q8::kBlock);
    const GridPos pos{block, 0, 0};
    const auto [unused, p, g, mp, blk, load_states, gc, key, base] =
        StepFrame<P, G, M, Rule>::make(meta, pos, a, 0);
    auto list = [&](int slot) { return meta.addresses[slot][s.tensor]; };
    c.p = p;
    c.g = g;
    c.mp = mp;
    c.blk = blk;
    c.load_states = load_states;
    c.gc = gc;
    c.key = key;
    c.sr_base = base;
    bool aligned = vec_aligned<P>(p) && vec_aligned<G>(g) && master_aligned(mp);
#pragma unroll
    for (int k = 0; k < kStates; ++k) {
      c.codes[k] = static_cast<const uint8_t*>(list(Rule::codes_slot(k)));
      c.absmax[k] = static_cast<float*>(list(Rule::absmax_slot(k)));
      aligned = aligned &&
                reinterpret_cast<uintptr_t>(c.codes[k]) % sizeof(uint32_t) == 0;
    }
    c.lists_aligned = aligned;
    const q8::RowBlocks rb(static_cast<int64_t>(
        reinterpret_cast<uintptr_t>(meta.addresses[Rule::kRow][s.tensor])));
    c.row = rb.row;
    c.per_row = rb.per_row;
    const int64_t qb = s.start / q8::kBlock + first;
    c.block_row = qb / rb.per_row;
    c.block_col = qb % rb.per_row;
    c.qb = qb;
    place(c);
    return c;
  }

  MIXPREC_HD static int rounds(const Cursor& c) { return c.rounds; }

  // To the thread's next round (stride blocks on, across rows: blocks are
  // numbered row by row, so qb moves by stride; the rows crossed are counted
  // by subtraction, at most stride of them, one for rows of stride blocks or
  // more, so no division).
  MIXPREC_HD static void advance(Cursor& c) {
    c.qb += c.stride;
    c.block_col += c.stride;
    while (c.block_col >= c.per_row) {
      c.block_col -= c.per_row;
      ++c.block_row;
    }
    place(c);
  }

  // The first element (in its state block) of run j of `lane`.
  MIXPREC_HD static int run_start(int j, int lane) {
    return j * (kOptVec * kWarpSize) + kOptVec * lane;
  }

  // Whether the current block takes the whole-block path.
  MIXPREC_HD static bool whole(const Cursor& c) {
#ifdef MIXPREC_SASS_FAST_PATH_ONLY
    // (tools/sass_check.py counts the fast path's instructions in a build
    // that has no other: never defined in the libraries)
    return (void)c, true;
#else
    return c.length == q8::kBlock && c.lists_aligned && c.start % kOptVec == 0;
#endif
  }

  // The round's loads: weights (the master, or the param), grads, code words
  // and old maxima, as whole vectors on the whole-block path.
  MIXPREC_HD void load(const Cursor& c, int lane, In& in) const {
    const bool fast = whole(c);
#pragma unroll
    for (int k = 0; k < kStates; ++k) {
      in.old_max[k] = c.load_states ? c.absmax[k][c.qb] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kRuns; ++j) {
      const int64_t i0 = c.start + run_start(j, lane);  // in the tensor
      const int count = run_count(c, fast, j, lane);
      float (&w)[kOptVec] = in.w[j];
      float (&gr)[kOptVec] = in.g[j];
#pragma unroll
      for (int k = 0; k < kStates; ++k) {
        in.words[k][j] = 0;
      }
      if (fast) {
        // (the vectors at element i0, a multiple of kOptVec: pointer
        // arithmetic, not a signed division of i0)
        load_working_vec(c.p + i0, master_at(c.mp, i0), 0, w);
        load_vec(c.g + i0, 0, gr);
        if (c.load_states) {
#pragma unroll
          for (int k = 0; k < kStates; ++k) {
            in.words[k][j] =
                *reinterpret_cast<const uint32_t*>(c.codes[k] + i0);
          }
        }
      } else {
#pragma unroll
        for (int e = 0; e < kOptVec; ++e) {
          w[e] = 0.0f;
          gr[e] = 0.0f;
          if (e < count) {
            w[e] = load_working(c.p, c.mp, i0 + e);
            gr[e] = static_cast<float>(c.g[i0 + e]);
            if (c.load_states) {
#pragma unroll
              for (int k = 0; k < kStates; ++k) {
                in.words[k][j] |= static_cast<uint32_t>(c.codes[k][i0 + e])
                                  << (8 * e);
              }
            }
          }
        }
      }
    }
  }

  // Elements of run j of `lane` in the current block.
  MIXPREC_HD static int run_count(const Cursor& c, bool fast, int j, int lane) {
    const int64_t rest = c.length - run_start(j, lane);
    return fast ? kOptVec
                : (rest <= 0
                       ? 0
                       : (rest < kOptVec ? static_cast<int>(rest) : kOptVec));
  }

  // The round's math on what load() read: the element updates, the param
  // (and master) stores, the new state values and their |max| per lane.
  MIXPREC_HD void phase1(const Cursor& c, int lane, const In& in, Lane& st,
                         float (&maxes)[kStates], const Args& a) const {
    P* const pp = c.p;
    M* const mp = c.mp;
#pragma unroll
    for (int k = 0; k < kStates; ++k) {
      maxes[k] = 0.0f;
    }
    const bool fast = whole(c);
#pragma unroll
    for (int j = 0; j < kRuns; ++j) {
      const int64_t i0 = c.start + run_start(j, lane);  // in the tensor
      const int count = run_count(c, fast, j, lane);
      float w[kOptVec];
#pragma unroll
      for (int e = 0; e < kOptVec; ++e) {
        w[e] = in.w[j][e];
      }
#pragma unroll
      for (int e = 0; e < kOptVec; ++e) {
        float x[kStates];
#pragma unroll
        for (int k = 0; k < kStates; ++k) {
          x[k] =
              c.load_states
                  ? q8::decode(static_cast<uint8_t>(in.words[k][j] >> (8 * e)),
                               in.old_max[k], Rule::table(k), c.tables)
                  : 0.0f;
        }
        if (e < count) {
          Rule::update(w[e], math::prepare_grad(in.g[j][e], c.gc), x, a, c.blk);
#pragma unroll
          for (int k = 0; k < kStates; ++k) {
            maxes[k] = q8::abs_max(maxes[k], x[k]);
          }
        }
#pragma unroll
        for (int k = 0; k < kStates; ++k) {
          st.x[k][j][e] = x[k];
        }
      }
      const uint32_t base = c.sr_base + static_cast<uint32_t>(i0);
      if (fast) {
        store_working_vec(pp + i0, master_at(mp, i0), 0, w, a.sr, c.key, base);
      } else {
#pragma unroll
        for (int e = 0; e < kOptVec; ++e) {
          if (e < count) {
            store_working(pp, mp, i0 + e, w[e], a.sr, c.key,
                          base + static_cast<uint32_t>(e));
          }
        }
      }
    }
  }

  MIXPREC_HD void phase2(const Cursor& c, int lane, const Lane& st,
                         const float (&maxes)[kStates], const Args&) const {
    const bool fast = whole(c);
#pragma unroll
    for (int k = 0; k < kStates; ++k) {
      uint8_t* codes = const_cast<uint8_t*>(c.codes[k]);
      const float a = maxes[k];
      // q8::encode of each element: the block's a > 0 test taken once (a
      // block of zeros, or a NaN maximum, is all zero codes)
      uint32_t words[kRuns];
      if (a > 0.0f) {
#pragma unroll
        for (int j = 0; j < kRuns; ++j) {
          words[j] = 0;
#pragma unroll
          for (int e = 0; e < kOptVec; ++e) {
            words[j] |= static_cast<uint32_t>(q8::encode_fraction(
                            st.x[k][j][e] / a, Rule::table(k), c.tables))
                        << (8 * e);
          }
        }
      } else {
#pragma unroll
        for (int j = 0; j < kRuns; ++j) {
          words[j] =
              static_cast<uint32_t>(q8::zero_lo(Rule::table(k))) * 0x01010101u;
        }
      }
#pragma unroll
      for (int j = 0; j < kRuns; ++j) {
        const int64_t i0 = c.start + run_start(j, lane);
        const int64_t rest = c.length - run_start(j, lane);
        const uint32_t word = words[j];
        if (fast) {
          *reinterpret_cast<uint32_t*>(codes + i0) = word;
        } else {
#pragma unroll
          for (int e = 0; e < kOptVec; ++e) {
            if (e < rest) {
              codes[i0 + e] = static_cast<uint8_t>(word >> (8 * e));
            }
          }
        }
      }
      if (lane == 0) {
        c.absmax[k][c.qb] = a;
      }
    }
  }
};

}  // namespace cuda
}  // namespace mixprec
