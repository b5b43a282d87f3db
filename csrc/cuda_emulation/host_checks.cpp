// The host-side argument checks (csrc/common/*.cpp) compiled into the test
// library mixprec/_cuda_emulation as well: each library keeps its symbols
// hidden, so this one carries its own copy. (One translation unit
// here rather than the same sources twice in setup.py: the two extensions
// would write the same object files.) A new csrc/common/*.cpp that the
// launchers call goes here too; missing, the library fails to load (an
// undefined symbol), and with it tests/ops/test_cuda_emulation.py.
#include "common/checks.cpp"
#include "common/optim_args.cpp"
