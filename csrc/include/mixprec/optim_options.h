// The options of mixprec's C++ optimizers (mixprec/optim.h), one X-macro row
// per option. Header-only and free of torch includes: the op library reads
// the live options from here (build_info.cpp) for Python's capture rules.
#pragma once

namespace mixprec {
namespace optim {

// Each options class is generated from one list of its options, the
// X-macros below: the TORCH_ARG setters/getters and defaults in optim.h, and in
// csrc/api (options_table.h) the torch::save archive (serialize), the
// state_dict() group entries and their loading, the checks, and the settings
// a mixprec::CapturedStep bakes in. Adding an option is one row; the key is
// the option's name everywhere (Python's keyword and state-dict key).
//
// A row: X(type, name, default, check, flags)
//   check  how a constructor checks the value: none, nonneg (a finite
//          number >= 0), betas (each in [0, 1)), bits (8 or 32), count (an
//          int >= 0), correction (0, 16 or 8); checks that relate two options
//          (or an option and the params) are in optim.cpp
//   flags  options_flag values, or'ed:
namespace options_flag {
enum : unsigned {
  // mixprec's own option: in a state dict's group after torch's entries;
  // may be absent from a torch::save archive (it then keeps its default)
  kMixprec = 0,
  // a key of torch.optim's own group: first in a state dict's group, and
  // required in a torch::save archive
  kTorch = 1,
  // read at every step (lr: the device tensor the kernels read), so not
  // baked into a captured graph
  kLive = 2,
  // not taken from a loaded state dict: the optimizer keeps its own value
  // (state_bits: a checkpoint's moments are converted to it)
  kKept = 4,
};
}  // namespace options_flag

// torch.optim.Adam's options, shared by Adam and AdamW (whose weight_decay
// defaults differ).
#define MIXPREC_ADAM_TORCH_OPTIONS(X, weight_decay_default)     \
  X(double, lr, 1e-3, nonneg, kTorch | kLive)                   \
  X(betas_t, betas, std::make_tuple(0.9, 0.999), betas, kTorch) \
  X(double, eps, 1e-8, nonneg, kTorch)                          \
  X(double, weight_decay, weight_decay_default, nonneg, kTorch) \
  X(bool, amsgrad, false, none, kTorch)                         \
  X(bool, maximize, false, none, kTorch)

// mixprec's options of every optimizer.
//   master_weights: a float32 master copy of each 16-bit param
//   stochastic_rounding: of bfloat16 params without masters
//   seed: of the stochastic rounding
//   state_bits: 8: block-wise 8-bit moments (uint8 codes + float32 maxima
//     per block of 256 in a row) for params of at least min_8bit_size
//     elements and two or more dims; 32: float32 moments
//   master_correction_bits: 16 or 8: the master of a bfloat16 param kept as
//     the param plus an int16 / int8 correction (state master_correction)
//     instead of a float32 master_param; 0 (Python's None): float32 masters.
//     float16 params are refused with it (docs/optimizers.md, split masters)
#define MIXPREC_OPTIM_MIXPREC_OPTIONS(X)              \
  X(bool, master_weights, true, none, kMixprec)       \
  X(bool, stochastic_rounding, false, none, kMixprec) \
  X(int64_t, seed, 0, none, kMixprec)                 \
  X(int64_t, state_bits, 32, bits, kKept)             \
  X(int64_t, min_8bit_size, 4096, count, kMixprec)    \
  X(int64_t, master_correction_bits, 0, correction, kKept)

// Adam: decoupled_weight_decay selects AdamW's decay (which AdamW always
// uses). state_bits 8 is not with amsgrad.
#define MIXPREC_ADAM_OPTIONS(X)                          \
  MIXPREC_ADAM_TORCH_OPTIONS(X, 0)                       \
  X(bool, decoupled_weight_decay, false, none, kMixprec) \
  MIXPREC_OPTIM_MIXPREC_OPTIONS(X)

#define MIXPREC_ADAMW_OPTIONS(X)      \
  MIXPREC_ADAM_TORCH_OPTIONS(X, 1e-2) \
  MIXPREC_OPTIM_MIXPREC_OPTIONS(X)

// SGD: state_bits 8 codes the momentum buffer (with momentum != 0).
#define MIXPREC_SGD_OPTIONS(X)                \
  X(double, lr, 1e-3, nonneg, kTorch | kLive) \
  X(double, momentum, 0, nonneg, kTorch)      \
  X(double, dampening, 0, none, kTorch)       \
  X(double, weight_decay, 0, nonneg, kTorch)  \
  X(bool, nesterov, false, none, kTorch)      \
  X(bool, maximize, false, none, kTorch)      \
  MIXPREC_OPTIM_MIXPREC_OPTIONS(X)

}  // namespace optim
}  // namespace mixprec
