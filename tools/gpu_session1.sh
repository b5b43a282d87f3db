#!/usr/bin/env bash
# GPU call 1 (2026-11-26): build the current tree once, keep the built package for a later
# before/after run, and run the GPU items earlier issues left unproven (8-bit CUDA kernels and
# their bench beside torchao/bitsandbytes, memcheck over the two largest workload sets, the
# FSDP2 example's recipe A under faulthandler). Every part has its own timeout; logs in $OUT.
set -u
export PYTHONUNBUFFERED=1 CXX=/usr/bin/g++ CC=/usr/bin/gcc TORCH_CUDA_ARCH_LIST=9.0a \
  MIXPREC_FORCE_CUDA=1 MAX_JOBS=16
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=python3
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
{ nvidia-smi -L; $PY -c "import torch,sys;print(torch.__version__, sys.version.split()[0])"; \
  git log -1 --format=%H 2>/dev/null; date -u; } > "$OUT/build.log" 2>&1; cat "$OUT/build.log"
el build
timeout 260 $PY setup.py build_ext --inplace >> "$OUT/build.log" 2>&1; rc=$?
el "build rc=$rc"; tail -3 "$OUT/build.log"
[ $rc = 0 ] || exit 1
tar czf "$OUT/before_pkg.tgz" python/mixprec/_C*.so
ls -la "$OUT/before_pkg.tgz"
export PYTHONPATH=$PWD/python:$PWD/.gpu_peers
$PY -c "import mixprec; print(mixprec.build_info())" 2>&1 | tail -2
el bench_optim
timeout 150 $PY benchmarks/bench_optim.py --device cuda --rounds 1 --min-run-time 0.2 \
  > "$OUT/bench_optim.log" 2>&1; el "bench_optim rc=$?"
{
  el tests8
  timeout 200 $PY -m pytest -q -p no:cacheprovider -n 6 tests/test_optim_8bit.py \
    tests/test_quant8_kernels.py >> "$OUT/tests8.log" 2>&1; el "tests8 rc=$?"
} >> "$OUT/tests8.log" 2>&1 &
{
  for r in A-bf16 A-fp16; do
    PYTHONFAULTHANDLER=1 timeout -s ABRT 60 $PY -m torch.distributed.run --nproc-per-node 1 \
      examples/fsdp2_train.py --device cuda --recipe $r --steps 60 2>&1 | tail -60
    echo "== $r rc=${PIPESTATUS[0]}"
  done
} > "$OUT/fsdp2A.log" 2>&1 &
for s in 2^26 gpt2-small; do
  {
    el "memcheck $s"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 160 compute-sanitizer --tool memcheck \
      --error-exitcode 99 --leak-check no --kernel-name kns=mixprec \
      $PY tools/gpu_workload.py --device cuda --sets $s 2>&1 | tail -60
    el "memcheck $s rc=${PIPESTATUS[0]}"
  } > "$OUT/memcheck_${s/^/p}.log" 2>&1 &
done
wait
el done
grep -E "passed|failed|error" "$OUT/tests8.log" | tail -3
grep -E "rc=|step|Fatal|File" "$OUT/fsdp2A.log" | head -30
grep -E "rc=|ERROR SUMMARY|FAIL" "$OUT"/memcheck_*.log | head -40
tail -25 "$OUT/bench_optim.log"
