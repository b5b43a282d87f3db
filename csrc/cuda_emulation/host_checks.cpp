// The host-side argument checks (csrc/common/*.cpp) compiled into the CUDA
// emulation's shared library as well: the op library keeps its symbols
// hidden, so the emulation carries its own copy. (One translation unit here
// rather than the same sources listed twice in the build: the two libraries
// would write the same object files.) A new csrc/common/*.cpp that the
// launchers call goes here too; missing, the library fails to load (an
// undefined symbol), and with it tests/ops/test_cuda_emulation.py.
#include "common/checks.cpp"
#include "common/optim_args.cpp"
