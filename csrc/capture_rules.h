// The rules of a captured step, one list for both twins: Python's
// mixprec.capture (which reads them from the op library) and C++'s
// mixprec::CapturedStep (csrc/api/capture.cpp). docs/capture.md states the
// contract they implement.
//
// MIXPREC_FOR_EACH_SYNC_OP(X): the dispatcher ops that read a device value on
// the host (a sync on CUDA; under capture an error, or a value baked into the
// graph), as X(op name, rule):
//   reads      the op reads a device value on the host, always
//   bool_mask  indexing with a boolean (or uint8) mask: a nonzero on the
//              device, whose size the host reads
//   to_host    a copy from a non-CPU tensor into a CPU one
// Besides these, any op that returns a float or a bool (a value read back to
// the host) counts; an int does not (a size the op knows on the host, as
// cuDNN attention's max sequence lengths).
//
// MIXPREC_FOR_EACH_SCALER_SETTING(X): the scaler's settings a graph bakes in,
// as X(name, accessor): the C++ GradScaler's member function, also the
// Python GradScaler's method (called) or property of that name. The
// optimizers' settings a graph bakes in are every param-group option but the
// live ones: in C++ the rows flagged options_flag::kLive in mixprec/optim.h,
// exported to Python by build_info.cpp (capture_live_options).
#pragma once

#define MIXPREC_FOR_EACH_SYNC_OP(X)        \
  X("aten::_local_scalar_dense", reads)    \
  X("aten::item", reads)                   \
  X("aten::is_nonzero", reads)             \
  X("aten::equal", reads)                  \
  X("aten::allclose", reads)               \
  X("aten::nonzero", reads)                \
  X("aten::nonzero_numpy", reads)          \
  X("aten::argwhere", reads)               \
  X("aten::masked_select", reads)          \
  X("aten::unique", reads)                 \
  X("aten::_unique", reads)                \
  X("aten::_unique2", reads)               \
  X("aten::unique_dim", reads)             \
  X("aten::unique_consecutive", reads)     \
  X("aten::unique_dim_consecutive", reads) \
  X("aten::bincount", reads)               \
  X("aten::histc", reads)                  \
  X("aten::repeat_interleave", reads)      \
  X("aten::tolist", reads)                 \
  X("aten::_assert_async", reads)          \
  X("aten::is_set_to", reads)              \
  X("aten::index", bool_mask)              \
  X("aten::index_put_", bool_mask)         \
  X("aten::index_put", bool_mask)          \
  X("aten::_index_put_impl_", bool_mask)   \
  X("aten::copy_", to_host)                \
  X("aten::_copy_from", to_host)           \
  X("aten::_to_copy", to_host)             \
  X("aten::to", to_host)

#define MIXPREC_FOR_EACH_SCALER_SETTING(X) \
  X(enabled, is_enabled)                   \
  X(growth_factor, get_growth_factor)      \
  X(backoff_factor, get_backoff_factor)    \
  X(growth_interval, get_growth_interval)  \
  X(hysteresis, hysteresis)                \
  X(min_scale, min_scale)                  \
  X(max_scale, max_scale)
