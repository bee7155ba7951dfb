#!/usr/bin/env bash
# The GPU figures in one pass on a machine with one CUDA device: the CUDA tests, the metrics panel
# against torchmetrics on the device, the bench overhead of one default run, and the wall time of
# the whole default bench (30 runs) with W worker processes sharing the GPU.
#
#   bash benchmarks/gpu_checks.sh OUT_DIR [DATA_DIR] [WORKERS] [PRESET]
#
# DATA_DIR holds the four Fashion-MNIST idx files (default: the Debian package's folder). Every
# step has its own time limit and writes its log under OUT_DIR, so one step that fails or hangs
# leaves the others' figures. PRESET=smoke (with no GPU: the script runs on the CPU) tries the
# script itself in a minute.
set -u
OUT=${1:?usage: gpu_checks.sh OUT_DIR [DATA_DIR] [WORKERS] [PRESET]}
DATA=${2:-/usr/share/datasets/fashion-mnist}
WORKERS=${3:-8}
PRESET=${4:-default}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
FMNIST=/usr/share/datasets/fashion-mnist  # where calibkit looks without --data-dir (bench_overhead.py has none)
if [ ! -f "$FMNIST/train-images-idx3-ubyte.gz" ] && [ "$DATA" != "$FMNIST" ]; then
    mkdir -p "$FMNIST" && cp "$DATA"/*-ubyte.gz "$FMNIST"/ || echo "could not copy $DATA to $FMNIST"
fi
DEVICE=$($PY -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
step() {  # step NAME SECONDS CMD...: run CMD with a limit, log to OUT/NAME.log, print its tail
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    echo "== $name (limit ${limit}s)"
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc after $((SECONDS - t0)) s"
    tail -n 25 "$OUT/$name.log"
}
{
    echo "device: $DEVICE; workers: $WORKERS; preset: $PRESET"
    $PY -c "import torch, platform; print('torch', torch.__version__, 'python', platform.python_version(), \
'gpu', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none')"
    nproc
} | tee "$OUT/machine.log"
step cuda_tests 90 $PY -m pytest -q -p no:cacheprovider tests/test_metrics_cuda.py tests/methods/csm/test_api.py -k "cuda or Cuda or CUDA or device"
BENCH=${BENCH_DIR:-/tmp/calibkit_gpu_bench}
rm -rf "$BENCH"
BENCH_T0=$SECONDS
step bench 280 $PY -m calibkit bench --preset "$PRESET" --out "$BENCH" --data-dir "$DATA" --device "$DEVICE" \
    --workers "$WORKERS" --num-threads 1
echo "bench wall time: $((SECONDS - BENCH_T0)) s for $PRESET with $WORKERS workers on $DEVICE" | tee -a "$OUT/machine.log"
cp "$BENCH/report/report.md" "$OUT/report.md" 2>/dev/null
tar czf "$OUT/bench.tgz" -C "$BENCH" runs.db logs report 2>/dev/null
step metrics_speed 90 $PY benchmarks/metrics_speed.py --device "cpu,$DEVICE" --repeats 5
step bench_overhead 120 $PY benchmarks/bench_overhead.py --preset "$PRESET" --device "$DEVICE"
