#!/usr/bin/env bash
# A GPU lease's checks as one command (5 minutes on one H200; each part has its own timeout,
# 14.5 minutes in all at worst, so a hung part costs the later ones): the GPU suite,
# then GPT-2 small (124M) bf16 on one GPU, eager and compiled, refddp's step against a plain
# one (step_overhead.py), then the small jobs' step overhead. Logs and results go to $OUT
# (the device tool's folder; /tmp/gpu_lease elsewhere). Run from the repository root, on a
# machine whose python3 has torch with CUDA, transformers, pytest-xdist and hypothesis.
# SUITE=0 skips the suite; TAG=_x names the results gpu_..._x (a second run in one lease).
# GPT-2 124M's two runs end with one profiled block of each loop (traces.tgz). The logs go
# into logs.tgz: the device tool returns at most 8 files.
set -u
OUT=${OUT:-/tmp/gpu_lease}
TAG=${TAG:-}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 \
    || { tail -20 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  git rev-parse HEAD; git status --short; } >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
if [ "${SUITE:-1}" != 0 ]; then
    echo "== GPU suite"
    timeout 300 python3 -m pytest -m gpu tests/gpu -n 4 -q -p no:cacheprovider >"$OUT/gpu_suite.log" 2>&1
    echo "exit $?"; tail -3 "$OUT/gpu_suite.log"
fi
bench() {  # NAME TIMEOUT ARGS...: step_overhead.py, its result kept in $OUT
    local name=$1$TAG limit=$2; shift 2
    case $name in gpu_gpt2_124m*) set -- "$@" --profile "$OUT/traces/$name" ;; esac
    echo "== $name: step_overhead.py $*"
    timeout "$limit" python3 benchmarks/step_overhead.py --device cuda --ranks 1 --name "$name" "$@" \
        >"$OUT/$name.log" 2>&1
    echo "exit $?"; tail -4 "$OUT/$name.log"
    cp "benchmarks/results/$name.json" "$OUT/" 2>/dev/null
}
bench gpu_gpt2_124m_bf16 150 --models gpt2_124m --amp bf16 --blocks 20 --steps 8
bench gpu_gpt2_124m_bf16_compile 300 --models gpt2_124m --amp bf16 --compile --blocks 20 --steps 8
bench gpu_step_overhead_small 120 --models demo,gpt2 --blocks 20 --steps 16
(cd "$OUT" && tar czf logs.tgz machine.txt ./*.log && rm -f ./*.log)
[ -d "$OUT/traces" ] && (cd "$OUT" && tar czf traces.tgz traces && rm -rf traces)
ls -la "$OUT"
