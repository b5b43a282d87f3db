// The host-side argument checks (csrc/common/*.cpp) compiled into the CUDA op
// library as well: each library keeps its symbols hidden, so it carries its
// own copy. (One translation unit here rather than the same sources twice in
// setup.py: the two libraries would write the same object files.) A new
// csrc/common/*.cpp that the launchers call goes here too; missing, the
// library fails to load (an undefined symbol).
#include "common/checks.cpp"
#include "common/optim_args.cpp"
