// MIXPREC_API marks what libmixprec exports. The library is built with hidden
// default visibility (CMakeLists.txt: CXX_VISIBILITY_PRESET hidden), so only
// the classes and functions of the public headers that carry this macro are
// visible to programs linking it; everything else stays internal.
#pragma once

#if defined(_WIN32)
#if defined(MIXPREC_BUILDING_LIBRARY)
#define MIXPREC_API __declspec(dllexport)
#else
#define MIXPREC_API __declspec(dllimport)
#endif
#else
#define MIXPREC_API __attribute__((visibility("default")))
#endif
