// What the library was built with, the op list and the capture rules: for
// C++ (include/mixprec/build_info.h) and, as C functions read with ctypes,
// for the Python package (python/mixprec/_extension.py), which has no
// extension module of its own.
#include "mixprec/build_info.h"

#include <torch/csrc/stable/ops.h>

#include <atomic>
#include <string>

#include "capture_rules.h"
#include "cpu/span_kernels.h"
#include "mixprec/optim_options.h"
#include "mixprec_build_config.h"
#include "op_table.h"

namespace mixprec {

BuildInfo build_info() {
  return BuildInfo{MIXPREC_VERSION,
                   MIXPREC_TORCH_VERSION,
                   MIXPREC_WITH_CUDA_KERNELS != 0,
                   MIXPREC_CUDA_VERSION,
                   MIXPREC_CUDA_ARCHS,
                   MIXPREC_CXX_COMPILER,
                   MIXPREC_CXX_COMPILER_VERSION,
                   MIXPREC_NVCC_VERSION};
}

std::string cpu_capability() { return cpu::span_kernels().name; }

int cpu_kernel_threads() {
  // One item per thread: each thread of torch's pool runs one chunk.
  std::atomic<int> chunks{0};
  torch::stable::parallel_for(
      0, static_cast<int64_t>(torch::stable::get_num_threads()), 1,
      [&](int64_t, int64_t) {
        chunks.fetch_add(1, std::memory_order_relaxed);
      });
  return chunks.load();
}

namespace {

// `s` as a JSON string literal.
std::string json_str(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      static const char hex[] = "0123456789abcdef";
      out += "\\u00";
      out += hex[(c >> 4) & 0xf];
      out += hex[c & 0xf];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// build_info(), the op names (MIXPREC_FOR_EACH_OP, in table order) and the
// capture rules (capture_rules.h; the live optimizer options: the rows of
// mixprec/optim_options.h flagged kLive), as one JSON object.
std::string describe() {
  const BuildInfo info = build_info();
  std::string j = "{";
  j += "\"version\": " + json_str(info.version);
  j += ", \"torch_version\": " + json_str(info.torch_version);
#ifdef TORCH_TARGET_VERSION
  // The oldest torch whose stable ABI the library was built for ("2.11").
  j += ", \"torch_target\": " +
       json_str(std::to_string((TORCH_TARGET_VERSION >> 56) & 0xff) + "." +
                std::to_string((TORCH_TARGET_VERSION >> 48) & 0xff));
#endif
  j += std::string(", \"cuda_kernels\": ") +
       (info.cuda_kernels ? "true" : "false");
  j += ", \"cuda_version\": " + json_str(info.cuda_version);
  j += ", \"cuda_archs\": " + json_str(info.cuda_archs);
  j += ", \"cxx_compiler\": " + json_str(info.cxx_compiler);
  j += ", \"cxx_compiler_version\": " + json_str(info.cxx_compiler_version);
  j += ", \"nvcc_version\": " + json_str(info.nvcc_version);
  j += ", \"git_commit\": " + json_str(MIXPREC_GIT_COMMIT);
  j += ", \"op_names\": [";
  const char* sep = "";
#define MIXPREC_OP_NAME_(op) \
  j += sep + json_str(#op);  \
  sep = ", ";
  MIXPREC_FOR_EACH_OP(MIXPREC_OP_NAME_)
#undef MIXPREC_OP_NAME_
  j += "], \"capture_sync_ops\": {";
  sep = "";
#define MIXPREC_SYNC_OP_ENTRY_(name, rule)            \
  j += sep + json_str(name) + ": " + json_str(#rule); \
  sep = ", ";
  MIXPREC_FOR_EACH_SYNC_OP(MIXPREC_SYNC_OP_ENTRY_)
#undef MIXPREC_SYNC_OP_ENTRY_
  j += "}, \"capture_scaler_settings\": [";
  sep = "";
#define MIXPREC_SCALER_SETTING_ENTRY_(name, accessor)                          \
  j += sep + std::string("[") + json_str(#name) + ", " + json_str(#accessor) + \
       "]";                                                                    \
  sep = ", ";
  MIXPREC_FOR_EACH_SCALER_SETTING(MIXPREC_SCALER_SETTING_ENTRY_)
#undef MIXPREC_SCALER_SETTING_ENTRY_
  j += "], \"capture_live_options\": [";
  sep = "";
  {
    using namespace optim::options_flag;  // the rows' flags
#define MIXPREC_LIVE_OPTION_(type, name, default_value, check, flags) \
  if ((flags) & kLive) {                                              \
    j += sep + json_str(#name);                                       \
    sep = ", ";                                                       \
  }
    MIXPREC_ADAM_OPTIONS(MIXPREC_LIVE_OPTION_)
    MIXPREC_ADAMW_OPTIONS(MIXPREC_LIVE_OPTION_)
    MIXPREC_SGD_OPTIONS(MIXPREC_LIVE_OPTION_)
#undef MIXPREC_LIVE_OPTION_
  }
  return j + "]}";
}

}  // namespace
}  // namespace mixprec

// The C entry points of the Python package (ctypes). None throws.
#define MIXPREC_C_ENTRY extern "C" __attribute__((visibility("default")))

// describe()'s JSON; valid for the life of the library.
MIXPREC_C_ENTRY const char* mixprec_build_info_json() {
  static const std::string s = mixprec::describe();
  return s.c_str();
}

// cpu_capability(); valid for the life of the library.
MIXPREC_C_ENTRY const char* mixprec_cpu_capability() {
  static const std::string s = mixprec::cpu_capability();
  return s.c_str();
}

// cpu_kernel_threads(), or -1 if it failed.
MIXPREC_C_ENTRY int mixprec_cpu_kernel_threads() {
  try {
    return mixprec::cpu_kernel_threads();
  } catch (...) {
    return -1;
  }
}
