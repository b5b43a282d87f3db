// Keeps the op libraries free of glibc symbol versions above GLIBC_2.28 when
// they are built on a newer system: force-included first into every
// translation unit of the op libraries (setup.py); tools/abi_gates.py checks
// that none is left. (Their libstdc++ symbol versions are the compiler's; the
// wheel's manylinux tag states them.)
//
//   * pow and dlsym are bound to their GLIBC_2.2.5 versions (glibc 2.29 gave
//     pow a new version; 2.34 moved dlsym, which torch's stable headers call,
//     into libc under a new version). Both versions behave the same for what
//     is called here.
//   * libstdc++'s headers read glibc 2.32's __libc_single_threaded to skip
//     atomic reference counts in single-threaded programs; a hidden definition
//     of our own, always 0 ("not single-threaded"), keeps every count atomic.
#pragma once

#if defined(__linux__) && defined(__x86_64__) && !defined(__CUDA_ARCH__)
__asm__(".symver pow,pow@GLIBC_2.2.5");
__asm__(".symver dlsym,dlsym@GLIBC_2.2.5");
#ifdef __cplusplus
extern "C" {
#endif
__attribute__((weak, visibility("hidden"))) char __libc_single_threaded = 0;
#ifdef __cplusplus
}
#endif
#endif
