#!/usr/bin/env bash
# Issue 29's GPU re-measure at the final tree (statistics counted in place, no op route table,
# since the H200 run of gpu_session2.sh at 434dd85): before (9471ec2, `git archive 9471ec2`
# unpacked in .gpuwork/before, carried) and after built side by side, then in one run GPT-2
# small e2e at 1x128 and 8x1024, the 2,000-tensor unscale and the AdamW + scaler step.
#   run(command="bash tools/gpu_session4.sh", carry=[".gpuwork"], timeout_s=560)
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
el done
grep -E "^(variant|amp-|fp16|bf16|fp32|###|\(rc)" "$E" | cut -c1-110
grep -E "^(###|set|2000|gpt2|ratio|\(rc)" "$M" | cut -c1-110
