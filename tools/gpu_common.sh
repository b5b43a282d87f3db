# Sourced by tools/gpu_session*.sh: the build environment of the GPU machine and the
# helpers that run each check in its own time limit under one DEADLINE (seconds).
export PYTHONUNBUFFERED=1 CXX=/usr/bin/g++ CC=/usr/bin/gcc TORCH_CUDA_ARCH_LIST=9.0a \
  MIXPREC_FORCE_CUDA=1 MAX_JOBS=${MAX_JOBS:-8}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
DEADLINE=${DEADLINE:-500}
PY=python3; ROOT=$PWD
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
left() { echo $(( DEADLINE - ($(date +%s) - t0) )); }
# run NAME NEED LIMIT LOG CMD...: only when NEED seconds are left, for at most LIMIT (or what is left)
run() {
  local name=$1 need=$2 limit=$3 log=$4; shift 4
  local l; l=$(left)
  if [ "$l" -lt "$need" ]; then el "SKIP $name ($l s left)"; echo "SKIP $name" >> "$log"; return; fi
  [ "$limit" -gt "$l" ] && limit=$l
  el "$name"; echo "### $name: $*" >> "$log"
  timeout "$limit" "$@" >> "$log" 2>&1; local rc=$?
  el "$name rc=$rc"; echo "(rc=$rc)" >> "$log"
}
{ nvidia-smi -L; $PY -c "import torch,sys;print(torch.__version__, sys.version.split()[0])"; \
  git log -1 --format=%H; date -u; } > "$OUT/build.log" 2>&1; cat "$OUT/build.log"
