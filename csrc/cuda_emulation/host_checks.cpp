// The host-side argument checks (csrc/common/*.cpp) compiled into the test
// extension mixprec._cuda_emulation_C as well: each Python extension keeps its
// symbols hidden, so this module carries its own copy. (One translation unit
// here rather than the same sources twice in setup.py: the two extensions
// would write the same object files.) A new csrc/common/*.cpp that the
// launchers call goes here too; missing, the module fails to load (an
// undefined symbol), and with it tests/ops/test_cuda_emulation.py.
#include "common/checks.cpp"
#include "common/optim_args.cpp"
