// Keeps the op libraries free of libstdc++ symbol versions above GLIBCXX_3.4.24
// (the manylinux_2_28 baseline, GCC 8's libstdc++) when they are built with a
// newer GCC: linked into every op library (setup.py), never into libmixprec.
//
// A newer libstdc++ moved a few members out of line: the headers declare them
// as explicit instantiations that live in the shared library under a new
// version (GLIBCXX_3.4.26 and 3.4.29), so each call site imports that version.
// Defining them here, in the library itself, binds every call site to these
// definitions at link time and leaves no import. The definitions are the
// header's own (explicit instantiations of its templates); the one plain
// function throws what libstdc++'s does. This is what the manylinux_2_28
// toolchain's libstdc++_nonshared does for the same symbols.
//
// tools/abi_gates.py fails the build on any libstdc++ version above 3.4.24,
// so a new such symbol (a newer GCC, a new call) is found, not shipped.
#include <new>
#include <sstream>
#include <string>
#include <string_view>

// The string streams' default constructors (GLIBCXX_3.4.26: declared apart
// from the (ios_base::openmode) ones) and, in C++20, their ref-qualified str()
// and view() (GLIBCXX_3.4.29).
#if defined(__GLIBCXX__) && _GLIBCXX_RELEASE >= 11 && __cplusplus > 201703L && \
    _GLIBCXX_USE_CXX11_ABI
#define MIXPREC_STRING_STREAM(cls)                           \
  template std::basic_##cls<char>::basic_##cls();            \
  template std::string std::basic_##cls<char>::str() const&; \
  template std::string std::basic_##cls<char>::str() &&;     \
  template std::string_view std::basic_##cls<char>::view() const noexcept;
#elif defined(__GLIBCXX__) && _GLIBCXX_RELEASE >= 9
#define MIXPREC_STRING_STREAM(cls) \
  template std::basic_##cls<char>::basic_##cls();
#else
#define MIXPREC_STRING_STREAM(cls)
#endif
MIXPREC_STRING_STREAM(stringbuf)
MIXPREC_STRING_STREAM(istringstream)
MIXPREC_STRING_STREAM(ostringstream)
MIXPREC_STRING_STREAM(stringstream)
#undef MIXPREC_STRING_STREAM

#if defined(__GLIBCXX__) && _GLIBCXX_RELEASE >= 11
// GLIBCXX_3.4.29: what operator new[] calls when an array length overflows.
namespace std {
[[noreturn]] void __throw_bad_array_new_length() {
  throw std::bad_array_new_length();
}
}  // namespace std
#endif
