// Host-side helpers of the CPU fused-optimizer kernels (fused_adam_cpu.cpp,
// fused_sgd_cpu.cpp, with their 8-bit-state ops): the stochastic-rounding
// element numbering and the parallel pass over the chunks of the parameters (a
// WorkList, multi_tensor_cpu.h). The element loops are in
// fused_optim_span_impl.h, compiled per ISA into the table of span_kernels.h.
#pragma once

#include "common/tensor.h"

#include <cstdint>
#include <vector>

#include "common/optim_args.h"
#include "common/optim_math.h"
#include "common/quant8_math.h"
#include "cpu/multi_tensor_cpu.h"
#include "cpu/span_kernels.h"

namespace mixprec {
namespace cpu {

// span_dtype(ScalarType) comes from multi_tensor_cpu.h.

// SR element-index bases: per parameter, chunk_base * 65536 where chunk_base
// counts the 65536-element chunks of the earlier params with the same
// (param dtype, grad dtype), matching the CUDA kernels' block numbering.
inline std::vector<uint32_t> sr_index_bases(const optim::TensorRefs& params,
                                            const optim::TensorRefs& grads) {
  std::vector<uint32_t> bases(params.size(), 0);
  std::vector<std::pair<std::pair<int, int>, int64_t>>
      chunks;  // group -> count
  for (size_t t = 0; t < params.size(); ++t) {
    const std::pair<int, int> group{static_cast<int>(params[t]->scalar_type()),
                                    static_cast<int>(grads[t]->scalar_type())};
    int64_t* count = nullptr;
    for (auto& c : chunks) {
      if (c.first == group) {
        count = &c.second;
      }
    }
    if (count == nullptr) {
      chunks.push_back({group, 0});
      count = &chunks.back().second;
    }
    bases[t] = static_cast<uint32_t>(*count * math::kSrChunk);
    *count += (params[t]->numel() + math::kSrChunk - 1) / math::kSrChunk;
  }
  return bases;
}

// One chunk of one parameter as the span kernels take it.
struct ParamSpan {
  size_t t;       // the parameter (index into the FlatSet's lists)
  int64_t begin;  // the chunk's first element in the parameter
  int64_t n;      // elements in the chunk
  SpanDtype param_dtype;
  SpanDtype grad_dtype;
  char* p;                 // param element `begin`
  const char* g;           // grad element `begin`
  bool sr;                 // stochastic rounding (asked for, bfloat16 param)
  uint32_t sr_stream;      // SR stream: the grad dtype's code
  uint32_t sr_index_base;  // SR index of element `begin`

  // Element `begin` of the float32 list `view` of the FlatSet (a state or
  // the masters); null for a list not in use (view -1).
  float* f32(const optim::FlatSet& fs, int view) const {
    return view >= 0 ? fs.views[view][t]->mutable_data_ptr<float>() + begin
                     : nullptr;
  }

  // The masters (the FlatSet's list `view`: float32, or the int16 / int8
  // corrections of split masters) from element `begin`; kNone for view -1.
  MasterSpan master(const optim::FlatSet& fs, int view) const {
    if (view < 0) {
      return MasterSpan{nullptr, MasterDtype::kNone};
    }
    const Tensor& m = *fs.views[view][t];
    const ScalarType st = m.scalar_type();
    return MasterSpan{static_cast<char*>(m.data_ptr()) +
                          begin * static_cast<int64_t>(m.element_size()),
                      st == ScalarType::Short  ? MasterDtype::kInt16
                      : st == ScalarType::Char ? MasterDtype::kInt8
                                               : MasterDtype::kFloat};
  }

  // The 8-bit state `view` of the FlatSet (uint8 codes) from element `begin`,
  // with its maxima `absmax` (the call's list: contiguous, one per block) and
  // `row` elements per row (`begin` is a block's first element, as every
  // chunk start of for_each_span with rows is).
  CodedSpan coded(const optim::FlatSet& fs, int view, TensorList absmax,
                  int64_t row) const {
    return CodedSpan{fs.views[view][t]->mutable_data_ptr<uint8_t>() + begin,
                     absmax[t].mutable_data_ptr<float>() +
                         q8::RowBlocks(row).block_at(begin),
                     row, begin % row};
  }
};

// Elements per row of each param of `params` (8-bit state's row layout,
// common/quant8_math.h).
inline std::vector<int64_t> row_lengths(const optim::TensorRefs& params) {
  std::vector<int64_t> rows(params.size());
  for (size_t t = 0; t < params.size(); ++t) {
    rows[t] = q8::row_length(params[t]->sizes().data(), params[t]->dim());
  }
  return rows;
}

// Calls fn(const ParamSpan&) for every chunk of every parameter of `fs`, in
// parallel (a WorkList over the params), with the SR element numbering of the
// CUDA kernels (`sr_bases`, or sr_index_bases). With `rows` (8-bit state: each
// param's elements per row), chunks start and end at blocks: the WorkList runs
// over kBlock slots per block (q8::RowBlocks), mapped back to elements.
template <typename Fn>
void for_each_span(const optim::FlatSet& fs, bool stochastic_rounding,
                   std::optional<std::vector<int64_t>> sr_bases, Fn&& fn,
                   const std::vector<int64_t>* rows = nullptr) {
  const optim::TensorRefs& P = fs.views[0];
  const optim::TensorRefs& G = fs.views[1];
  std::vector<uint32_t> sr_base(P.size(), 0);
  if (stochastic_rounding && sr_bases.has_value()) {
    for (size_t t = 0; t < P.size(); ++t) {
      sr_base[t] = static_cast<uint32_t>((*sr_bases)[t]);
    }
  } else if (stochastic_rounding) {
    sr_base = sr_index_bases(P, G);
  }
  WorkList work;
  for (size_t t = 0; t < P.size(); ++t) {
    const int64_t n = P[t]->numel();
    const bool slots = rows != nullptr && n > 0;
    work.add(
        static_cast<int32_t>(t),
        slots ? n / (*rows)[t] * q8::RowBlocks((*rows)[t]).per_row * q8::kBlock
              : n);
  }
  work.for_each([&](const WorkItem& it) {
    const size_t t = static_cast<size_t>(it.tensor);
    const Tensor& pt = *P[t];
    const Tensor& gt = *G[t];
    int64_t b = it.begin;
    int64_t e = it.end;
    if (rows != nullptr) {  // block slots (multiples of kBlock) -> elements
      const q8::RowBlocks rb((*rows)[t]);
      const int64_t blocks = pt.numel() / rb.row * rb.per_row;
      b = rb.start(b / q8::kBlock);
      e = e / q8::kBlock == blocks ? pt.numel() : rb.start(e / q8::kBlock);
    }
    const int64_t psz = static_cast<int64_t>(pt.element_size());
    const int64_t gsz = static_cast<int64_t>(gt.element_size());
    const ParamSpan span{
        t,
        b,
        e - b,
        span_dtype(pt.scalar_type()),
        span_dtype(gt.scalar_type()),
        static_cast<char*>(pt.data_ptr()) + b * psz,
        static_cast<const char*>(gt.data_ptr()) + b * gsz,
        stochastic_rounding && pt.scalar_type() == ScalarType::BFloat16,
        static_cast<uint32_t>(gt.scalar_type()),
        sr_base[t] + static_cast<uint32_t>(b)};
    fn(span);
  });
}

}  // namespace cpu
}  // namespace mixprec
