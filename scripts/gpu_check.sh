#!/usr/bin/env bash
# GPU check (at most ~8 minutes): train a few certified steps on the GPU, replay them on the CPU
# (and a CPU-trained run on the GPU), print the verdicts and the timings.
#
#   scripts/gpu_check.sh                      # trainer on cuda, auditor on cpu (and the reverse)
#   scripts/gpu_check.sh --device cpu --tiny  # the CPU-only path (what tests/test_executor.py runs)
#
# Needs only the repository and `make setup` (or `pip install --no-deps torch==2.13.0 &&
# pip install -r requirements.lock`) with a CUDA build of torch. Python: $PY, else .venv/bin/python,
# else python3. Exit status: 0 all replays matched, 1 a replay diverged, 2 setup problem (no CUDA,
# no torch). Every command has its own timeout (the whole script stays under $BUDGET seconds).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)

DEVICE=cuda
STEPS=4
TINY=0
BUDGET=${BUDGET:-470}
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --tiny) TINY=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (expected --device D, --steps N, --tiny)" >&2; exit 2 ;;
  esac
done

PY=${PY:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export OMP_WAIT_POLICY=PASSIVE
START=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - START) )); }

# 1. The machine: torch, CUDA, the GPU.
if ! "$PY" - "$DEVICE" <<'EOF'
import sys
try:
    import torch
except ImportError as e:
    sys.exit(f"gpu_check: torch is not installed for this python ({e}); run make setup")
dev = sys.argv[1]
print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}, cuda available {torch.cuda.is_available()}, "
      f"CPU threads {torch.get_num_threads()}")
if dev.startswith("cuda"):
    if not torch.cuda.is_available():
        sys.exit("gpu_check: --device cuda but CUDA is not available (a CPU-only torch, or no GPU)")
    p = torch.cuda.get_device_properties(torch.device(dev))
    print(f"GPU {p.name}, {p.total_memory / 2**30:.0f} GiB, compute capability {p.major}.{p.minor}")
EOF
then exit 2; fi

CLI_TRAIN="from vtrain.cli import train_cmd; train_cmd()"
CLI_REPLAY="from vtrain.cli import replay_cmd; replay_cmd()"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
STATUS=0
ROWS=()

# run_pair NAME TRAIN_DEVICE REPLAY_DEVICE ARGS...: train on one device, replay on the other.
run_pair() {
  local name=$1 tdev=$2 rdev=$3; shift 3
  local run="$WORK/$name-$tdev" t r tl=$(( $(left) / 2 ))
  if [ "$tl" -lt 20 ]; then ROWS+=("| $name | $tdev | $rdev | skipped (time budget) | | |"); return; fi
  t=$(timeout "$tl" "$PY" -c "$CLI_TRAIN" --out "$run" "$@" --device "$tdev" 2>"$run.err" | tail -1)
  if [ -z "$t" ]; then
    ROWS+=("| $name | $tdev | $rdev | train failed: $(tail -1 "$run.err") | | |"); STATUS=1; return
  fi
  r=$(timeout "$(( $(left) - 5 ))" "$PY" -c "$CLI_REPLAY" --run "$run" --device "$rdev" 2>"$run.rerr" | tail -1)
  "$PY" - "$name" "$tdev" "$rdev" "$t" "$r" "$(tail -1 "$run.rerr")" >>"$WORK/rows" <<'EOF' || STATUS=1
import json, sys
name, tdev, rdev, t, r, err = sys.argv[1:]
t = json.loads(t)
try:
    r = json.loads(r)
except ValueError:
    print(f"| {name} | {tdev} | {rdev} | replay failed: {err} | {t['seconds'] / t['steps']:.3f} | |")
    sys.exit(1)
ok = r["first_divergent_step"] is None and r["matched"] == r["steps"]
verdict = f"{r['matched']}/{r['steps']} bit-exact" if ok else f"DIVERGES at step {r['first_divergent_step']}"
print(f"| {name} | {tdev} | {rdev} | {verdict} | {t['seconds'] / t['steps']:.3f} | {r['seconds'] / r['steps']:.3f} |")
sys.exit(0 if ok else 1)
EOF
}

if [ "$TINY" = 1 ]; then
  SMALL=(--model gpt --optimizer adamw --layers 1 --width 16 --heads 2 --context 8 --batch-size 2)
else
  SMALL=(--model gpt --optimizer adamw --layers 2 --width 64 --heads 4 --context 32 --batch-size 8)
fi
COMMON=(--steps "$STEPS" --interval "$STEPS" --threads "${THREADS:-$(nproc)}")

# 2. Step time on the device: certified vs plain torch fp32 (same run, ratios).
if [ "$TINY" = 0 ]; then
  timeout "$(( $(left) / 4 ))" "$PY" scripts/bench_numerics.py --device "$DEVICE" --skip-replication \
    --steps 3 --warmup 1 --modes fp32,round-nolog,certified --no-mlp || echo "(bench timed out or failed)"
fi

# 3. Replication across devices: the small GPT both ways, then any GPT-2 example spec.
run_pair small-gpt "$DEVICE" cpu "${SMALL[@]}" "${COMMON[@]}"
if [ "$DEVICE" != cpu ]; then run_pair small-gpt cpu "$DEVICE" "${SMALL[@]}" "${COMMON[@]}"; fi
for spec in examples/*gpt2*.json examples/*gpt2*.toml; do
  [ -f "$spec" ] || continue
  run_pair "$(basename "$spec")" "$DEVICE" cpu --spec "$spec" --threads "${THREADS:-$(nproc)}"
done

# 4. GPT-2 117M shapes (12 layers, d 768, vocab 50,257, context 256): certified steps on the device,
#    replay on the CPU under ATEN_CPU_CAPABILITY=default (bench_numerics.py (d)), if time is left.
if [ "$TINY" = 0 ] && [ "$DEVICE" != cpu ] && [ "$(left)" -gt 150 ]; then
  timeout "$(( $(left) - 10 ))" "$PY" scripts/bench_numerics.py --skip-timing --skip-replication --gpt2-117m \
    --device "$DEVICE" --gpt2-steps 3 --gpt2-fp32-steps 2 --threads "${THREADS:-$(nproc)}" \
    || echo "(GPT-2 117M section timed out or failed)"
fi

echo
echo "| config | trainer device | auditor device | verdict | train s/step | replay s/step |"
echo "|---|---|---|---|---|---|"
[ -f "$WORK/rows" ] && cat "$WORK/rows"
for row in "${ROWS[@]}"; do echo "$row"; done
echo
echo "gpu_check: $(( $(date +%s) - START )) s in all; status $STATUS"
exit $STATUS
