#!/usr/bin/env bash
# GPU call 2 (2026-11-26): the thin core before (9471ec2, carried in .gpuwork/before) and after
# (this tree), built side by side, then timed in one run: GPT-2 small e2e at 1x128 and 8x1024,
# the 2,000-tensor unscale and the AdamW + scaler step beside torch's; then, while time is left,
# the 8-bit bench beside torchao/bitsandbytes and memcheck of the two largest workload sets.
set -u
. tools/gpu_common.sh
B=$ROOT/.gpuwork/before
( cd "$B" && timeout 280 $PY setup.py build_ext --inplace > "$OUT/build_before.log" 2>&1; \
  echo "before rc=$?" >> "$OUT/build.log" ) &
( timeout 280 $PY setup.py build_ext --inplace >> "$OUT/build.log" 2>&1; echo "after rc=$?" ) &
wait; el built; grep -E "rc=" "$OUT/build.log"
for t in before after; do
  d=$ROOT; [ $t = before ] && d=$B
  PYTHONPATH=$d/python $PY -c "import mixprec; print('$t', mixprec.__file__, mixprec.build_info()['cuda_kernels'])"
done
E=$OUT/e2e.log; V=amp-torch,amp-mps,amp-mpopt,fp16-m,bf16-m,bf16-sr,bf16-m8
for preset in small large; do
  for t in before after; do
    d=$ROOT; extra=""; [ $t = before ] && { d=$B; extra="--flat-buffer off"; }
    run "e2e $preset $t" 40 90 "$E" env PYTHONPATH=$d/python $PY $d/benchmarks/bench_e2e.py \
      --device cuda --preset $preset --repeats 2 --warmup 3 --steps 15 --variants $V $extra
  done
done
M=$OUT/micro.log
for t in before after; do
  d=$ROOT; [ $t = before ] && d=$B
  run "unscale $t" 30 60 "$M" env PYTHONPATH=$d/python $PY $d/benchmarks/bench_unscale.py \
    --device cuda --sets b,a --min-run-time 0.2
  run "scaler $t" 30 80 "$M" env PYTHONPATH=$d/python $PY $d/benchmarks/bench_scaler.py \
    --device cuda --rounds 1 --min-run-time 0.2
done
if [ "${ONLY_TIMINGS:-0}" = 1 ]; then  # tools/gpu_session4.sh: the before/after timings only
  el done
  grep -E "^(variant|amp-|fp16|bf16|fp32|###|\(rc)" "$E" | cut -c1-110
  grep -E "^(###|set|2000|gpt2|ratio|\(rc)" "$M" | cut -c1-110
  exit 0
fi
run "hf overflow after" 45 90 "$OUT/hf.log" env PYTHONPATH=$ROOT/python $PY tools/gpu_hf_overflow.py \
  --steps 12 --overflow 3,7
run "capture correctness" 60 170 "$OUT/capture.log" env PYTHONPATH=$ROOT/python $PY \
  tools/gpu_capture_check.py --only correctness --correctness-limit 55
run "capture timings" 50 110 "$OUT/capture.log" env PYTHONPATH=$ROOT/python $PY \
  tools/gpu_capture_check.py --only timings --workloads gpt2_1x128,gpt2_8x1024,convnet \
  --variants captured,eager --timing-limit 35
export PYTHONPATH=$ROOT/python:$ROOT/.gpu_peers
run "bench_optim after" 80 110 "$OUT/bench_optim.log" $PY benchmarks/bench_optim.py \
  --device cuda --rounds 1 --min-run-time 0.2
for s in 2^26 gpt2-small; do
  run "memcheck $s" 60 150 "$OUT/memcheck.log" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
    compute-sanitizer --tool memcheck --error-exitcode 99 --leak-check no \
    --kernel-name kns=mixprec $PY tools/gpu_workload.py --device cuda --sets $s
done
el done
grep -E "^(variant|amp-|fp16|bf16|fp32|###|\(rc)" "$E" | cut -c1-110
grep -E "^(###|set|2000|gpt2|ratio|\(rc)" "$M" | cut -c1-110
grep -vE "Warning|warn|W1126|^\{" "$OUT/hf.log" | tail -16
tail -30 "$OUT/capture.log"
grep -E "AdamW8bit|ratio|###|\(rc" "$OUT/bench_optim.log" 2>/dev/null | cut -c1-110
grep -E "ERROR SUMMARY|FAIL|gpu_workload:|###|\(rc" "$OUT/memcheck.log" 2>/dev/null | head -20
