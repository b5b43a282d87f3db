// The test harness of the C++ tests (test_api.cpp, test_ops.cpp): CHECK
// macros that count passes and failures, and run_tests(), which runs named
// test functions and prints "N passed, M failed" last. Plain C++, no test
// framework; each test program is one translation unit.
#pragma once

#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace mixprec_test {

inline int g_passed = 0;
inline int g_failed = 0;

inline void check_impl(bool ok, const char* expr, const std::string& what,
                       const char* file, int line) {
  if (ok) {
    ++g_passed;
  } else {
    ++g_failed;
    std::printf("FAIL %s:%d: %s%s%s\n", file, line, expr,
                what.empty() ? "" : " -- ", what.c_str());
  }
}

using TestList = std::vector<std::pair<const char*, std::function<void()>>>;

// Runs every test (an exception counts as a failure of that test), prints a
// line per test and the totals; returns the exit status (0: no failure).
inline int run_tests(const TestList& tests) {
  for (const auto& [name, fn] : tests) {
    const int failed_before = g_failed;
    try {
      fn();
    } catch (const std::exception& e) {
      ++g_failed;
      std::printf("FAIL %s: unexpected exception: %s\n", name, e.what());
    }
    std::printf("%s %s\n", g_failed == failed_before ? "ok  " : "FAIL", name);
  }
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}

}  // namespace mixprec_test

// c10/util/Logging.h has a glog-style CHECK; these tests use their own.
#undef CHECK
#define CHECK(cond)                                                        \
  ::mixprec_test::check_impl(static_cast<bool>(cond), #cond, "", __FILE__, \
                             __LINE__)
#define CHECK_MSG(cond, msg)                                                  \
  ::mixprec_test::check_impl(static_cast<bool>(cond), #cond, (msg), __FILE__, \
                             __LINE__)

// Runs `stmt`, expects an exception of type Exc whose message contains
// `needle`.
#define CHECK_THROWS(Exc, stmt, needle)                                     \
  do {                                                                      \
    std::string _msg;                                                       \
    bool _threw = false;                                                    \
    try {                                                                   \
      stmt;                                                                 \
    } catch (const Exc& e) {                                                \
      _threw = true;                                                        \
      _msg = e.what_without_backtrace();                                    \
    }                                                                       \
    CHECK_MSG(_threw, std::string("expected " #Exc " from: " #stmt));       \
    CHECK_MSG(                                                              \
        !_threw || _msg.find(needle) != std::string::npos,                  \
        "message does not contain '" + std::string(needle) + "': " + _msg); \
  } while (0)
