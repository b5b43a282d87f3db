#!/usr/bin/env bash
# Issue 29's GPU re-measure at the final tree (statistics counted in place, no op route table,
# since the H200 run of gpu_session2.sh at 434dd85): before (9471ec2, `git archive 9471ec2`
# unpacked in .gpuwork/before, carried) and after built side by side, then in one run GPT-2
# small e2e at 1x128 and 8x1024, the 2,000-tensor unscale and the AdamW + scaler step.
#   run(command="bash tools/gpu_session4.sh", carry=[".gpuwork"], timeout_s=560)
# The same build and timings as the first part of tools/gpu_session2.sh, which it runs.
exec env ONLY_TIMINGS=1 bash tools/gpu_session2.sh
