#!/usr/bin/env bash
# The next GPU call: every open GPU item of issues 31 (one CUDA graph per step) and 32 (FP8),
# most important first, each in its own time limit, all under DEADLINE seconds. Carry
# .gpu_peers (torchao, bitsandbytes for Python 3.12). Results under $OUT.
#   run(command="bash tools/gpu_session3.sh", carry=[".gpu_peers"], timeout_s=590)
set -u
export MAX_JOBS=14 DEADLINE=${DEADLINE:-560}
. tools/gpu_common.sh
timeout 300 $PY setup.py build_ext --inplace >> "$OUT/build.log" 2>&1; echo "build rc=$?"
# the C++ API and its GPU test build in the background while the Python checks run
( timeout 420 make cpp-tests-build PYTHON="$(command -v $PY)" > "$OUT/cpp_build.log" 2>&1; \
  echo "cpp build rc=$?" >> "$OUT/cpp_build.log" ) &
export PYTHONPATH=$ROOT/python
C=$OUT/capture.log
run "capture correctness" 60 170 "$C" $PY tools/gpu_capture_check.py --only correctness \
  --correctness-limit 55
run "capture timings" 60 200 "$C" $PY tools/gpu_capture_check.py --only timings \
  --workloads gpt2_1x128,gpt2_8x1024,convnet --variants captured,eager,compile --timing-limit 60
wait
run "cpp capture (ctest -L gpu)" 20 90 "$OUT/cpp.log" ctest --test-dir build/cmake-tests -L gpu \
  --output-on-failure --no-tests=error
run "demo (trainer capture=True)" 40 120 "$OUT/demo.log" $PY examples/train_digits.py
export PYTHONPATH=$ROOT/python:$ROOT/.gpu_peers
run "fp8 1B stack" 60 200 "$OUT/fp8.log" $PY benchmarks/bench_fp8.py --device cuda
el done
tail -40 "$C"; tail -5 "$OUT/cpp_build.log"; tail -25 "$OUT/cpp.log"
grep -iE "captur|eager|step|acc" "$OUT/demo.log" | tail -12; tail -30 "$OUT/fp8.log"
