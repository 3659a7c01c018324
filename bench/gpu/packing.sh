#!/bin/bash
# Packing jobs onto one GPU (issue 42): N jobs whose cached peaks add up to
# more than the GPU, though at any moment only one needs its peak.
#
#   bench/gpu/packing.sh [BUNDLE] [OUT] [PART...]
#
# Parts (default: all):
#   alone      each kind of job alone on the GPU, natively and transparent:
#              the step time to compare against, and native cudaMalloc of a
#              peak (its first, cold gather)
#   alternate  N = 2, 3, 4, 6 jobs (NS_ALTERNATE), job i peaks in slot i of each cycle
#   random     N = 4 jobs, each cycle's slot order a random permutation
#   trainers   three training jobs of different sizes (peaks of 80, 60 and
#              40 GiB of activations in long-batch steps)
#   server     an inference server (Poisson requests, 1-4 GiB KV caches, one
#              large batch a cycle) beside a trainer, and the server alone
#              (SERVER_PEAKS: the batch's and the trainer's GiB, "60 90"),
#              and the floor: native, the batch halved so that both fit
#              (SERVER_RUNS: "beside alone" by default, alone in the modes
#              of MODES_SERVER_ALONE, else MODES_SERVER's; SERVER_FLOOR=0: no
#              floor; SERVER_REPEATS=K: all of it K times, interleaved)
# Each part runs its jobs under the modes in MODES_<PART> (default below):
#   native        PyTorch's defaults
#   expandable    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
#   empty-cache   defaults, torch.cuda.empty_cache() after each peak (by hand)
#   fraction      set_per_process_memory_fraction(1/N) (static partitioning)
#   transparent   allocd.enable(): PyTorch's allocator on the daemon's memory
#   transparent-no-stream  the same, sending the daemon no allocation stream
#                 (record_events=False): what the stream costs the job
#   run           the unchanged script under `allocd run`
# MPS=1 runs every part under NVIDIA's Multi-Process Service: a control
# daemon of this user's own (its pipes and log under OUT/mps; the GPU's
# compute mode is left as it is), whose clients are every job and allocd's
# daemon. The jobs' kernels then share the GPU's SMs instead of taking
# turns. A trainer runs at CUDA_MPS_CLIENT_PRIORITY=MPS_TRAINER_PRIORITY
# (default 1, below normal) on at most MPS_TRAINER_THREADS percent of the
# SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, default 100). MPS shares compute,
# not caches: each job's freed memory stays in its own PyTorch cache under
# MPS as it does without.
#
# Results: OUT/packing/<part>-N<n>-<mode>-<i>.json per job, OUT/packing.log,
# the daemon's log, and OUT/packing.tgz after each part;
# bench/gpu/summarize_packing.py OUT makes the tables.
set -u
bundle=$(cd "${1:-.gpu}" && pwd)
out=${2:-/tmp/allocd-packing}
shift $(( $# < 2 ? $# : 2 ))
parts=${*:-alone alternate random trainers server}
mkdir -p "$out/packing"
exec > >(tee -a "$out/packing.log") 2>&1
here=$(cd "$(dirname "$0")" && pwd)
sock=$out/allocd.sock daemon_log=$out/daemon.log
. "$here/common.sh"
export PYTHONUNBUFFERED=1
SLOT=${SLOT:-0.8} HOLD=${HOLD:-0.4} CYCLES=${CYCLES:-3}

# start_mps: the MPS control daemon for this run, quit when the script exits
# (its server exits with it). Every CUDA process started after it connects
# to it through CUDA_MPS_PIPE_DIRECTORY.
start_mps() {
  command -v nvidia-cuda-mps-control >/dev/null ||
    { echo "MPS=1: nvidia-cuda-mps-control is not on this machine"; exit 1; }
  export CUDA_MPS_PIPE_DIRECTORY=$out/mps/pipe CUDA_MPS_LOG_DIRECTORY=$out/mps/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || { echo "MPS=1: the control daemon did not start"; exit 1; }
  trap 'echo quit | nvidia-cuda-mps-control' EXIT
  echo "MPS: control daemon started (pipes in $CUDA_MPS_PIPE_DIRECTORY)"
}

step device
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee "$out/gpu.csv"
gpu_gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{print int($1/1024)}')
echo "GPU: $gpu_gib GiB"

# launch PART MODE N KIND... : N jobs at once, job i of kind KIND[i] (the
# last kind repeats), with the part's arguments in JOB_ARGS and per-job
# peaks in PEAKS (space-separated GiB, the last repeats); all start their
# first cycle at one instant, once every job is ready (its imports and CUDA
# done; at most 120 s).
launch() {
  local part=$1 mode=$2 n=$3; shift 3
  local kinds=("$@") peaks=($PEAKS) pids=() i kind peak env=() run=() jmode=$mode mps_env
  local go=$out/packing/go.$part.$n.$mode
  rm -f "$go" "$go".ready.*
  # Every run starts on an empty GPU: what the daemon cached for the last
  # run's jobs (memory reclaims moved between them, given back at their
  # exit; trimmed only after --trim-after idle) goes back first, or jobs
  # not under allocd would find it taken.
  allocctl pool trim >/dev/null || echo "allocctl pool trim failed"
  case $mode in
    expandable) env=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True); jmode=native ;;
    native) env=(PYTORCH_CUDA_ALLOC_CONF=) ;;
    transparent-no-stream) jmode="transparent --no-stream" ;;
    run) run=("$bin/allocd" run --socket "$sock" --job "pack-$part" --); jmode=native ;;
  esac
  for ((i = 0; i < n; i++)); do
    kind=${kinds[$(( i < ${#kinds[@]} ? i : ${#kinds[@]} - 1 ))]}
    peak=${peaks[$(( i < ${#peaks[@]} ? i : ${#peaks[@]} - 1 ))]}
    mps_env=()
    if [[ ${MPS:-0} != 0 && $kind == trainer ]]; then
      mps_env=(CUDA_MPS_CLIENT_PRIORITY=${MPS_TRAINER_PRIORITY:-1}
               CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=${MPS_TRAINER_THREADS:-100})
    fi
    env "${env[@]}" "${mps_env[@]}" timeout 300 "${run[@]}" python "$here/packing_job.py" --index "$i" --jobs "$n" \
        --kind "$kind" --mode $jmode --socket "$sock" --peak-gib "$peak" --slot "$SLOT" \
        --hold "$HOLD" --cycles "$CYCLES" --start-file "$go" $JOB_ARGS \
        --json "$out/packing/$part-N$n-$mode-$i.json" > "$out/packing/$part-N$n-$mode-$i.log" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 2400); do
    (( $(ls "$go".ready.* 2>/dev/null | wc -l) >= n )) && break
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null || break 2; done
    sleep 0.05
  done
  python -c "import time; print(time.time() + 0.5)" > "$go.tmp" && mv "$go.tmp" "$go"
  local failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=$((failed + 1)); done
  echo "$part N=$n $mode: $failed of $n jobs exited non-zero"
  python - "$out/packing" "$part-N$n-$mode" <<'EOF'
import glob, json, sys
for f in sorted(glob.glob(f"{sys.argv[1]}/{sys.argv[2]}-*.json")):
    r = json.load(open(f))
    print(f"  job {r['index']} {r['kind']}: ooms {r['ooms']} step_ooms {r['step_ooms']} "
          f"peaks {r['peaks_held']} step p50 {r['step_ms_p50']:.2f} ms p99 {r['step_ms_p99']:.2f} ms "
          f"gathers {r['gather_s'][:4]} req p99 {r['latency_ms_p99']:.1f} ms "
          f"reserved {r['max_reserved_gib']:.1f} GiB")
EOF
}

# peak GiB for N jobs: their cached peaks add up to 1.3x the GPU, and one
# peak is at most 0.6x the GPU (one at a time always fits).
peak_for() { python -c "print(round(min(0.6 * $gpu_gib, 1.3 * $gpu_gib / $1)))"; }
modes() { local v="MODES_$1"; echo "${!v:-$2}"; }

[[ ${MPS:-0} != 0 ]] && start_mps
start_daemon device
if want alone; then
  for kind in peaks trainer server; do
    PEAKS=$(peak_for 3) JOB_ARGS=""
    for mode in native transparent native transparent; do
      step "alone: $kind, $mode"; launch "alone-$kind" "$mode" 1 "$kind"
    done
  done
  pack packing
fi
if want alternate; then
  for n in ${NS_ALTERNATE:-2 3 4 6}; do
    default="native expandable empty-cache fraction transparent run"
    ((n >= 4)) && default="native empty-cache fraction transparent"
    PEAKS=$(peak_for "$n") JOB_ARGS="--schedule alternate"
    for mode in $(modes ALTERNATE "$default"); do
      step "alternate: N=$n, ${PEAKS} GiB peaks, $mode"; launch alternate "$mode" "$n" peaks
    done
    pack packing
  done
fi
if want random; then
  PEAKS=$(peak_for 4) JOB_ARGS="--schedule random --seed 3"
  for mode in $(modes RANDOM "native expandable empty-cache transparent"); do
    step "random: N=4, ${PEAKS} GiB peaks, $mode"; launch random "$mode" 4 peaks
  done
  pack packing
fi
if want trainers; then
  PEAKS="80 60 40" JOB_ARGS="--schedule alternate --width 2048 --batch 256"
  for mode in $(modes TRAINERS "native expandable empty-cache transparent"); do
    step "trainers: 80/60/40 GiB peaks, $mode"; launch trainers "$mode" 3 trainer
  done
  pack packing
fi
if want server; then
  # Job 0 the server (requests all the time, a 60 GiB batch in its slot),
  # job 1 the trainer (90 GiB of activations in its slot). The floor:
  # native, with a batch half as large, so that both jobs fit and nothing
  # moves; what is left is the GPU's compute shared with the trainer, which
  # no memory manager removes (SERVER_FLOOR=0: not run).
  # SERVER_REPEATS=K runs the whole list K times, each time starting one
  # run further down it, so that the host's drift between sequential runs
  # falls on every run alike; repeat r > 1 names its part "server.r",
  # "server-alone.r", "server-floor.r".
  read -r batch trainer_gib <<<"${SERVER_PEAKS:-60 90}"
  JOB_ARGS="--schedule alternate --rate 20 --slot 1.5 --hold 0.6"
  server_runs=()
  server_modes=$(modes SERVER "native expandable empty-cache transparent")
  if [[ " ${SERVER_RUNS:-beside alone} " == *" beside "* ]]; then
    for mode in $server_modes; do server_runs+=("server $mode"); done
  fi
  if [[ " ${SERVER_RUNS:-beside alone} " == *" alone "* ]]; then
    for mode in $(modes SERVER_ALONE "$server_modes"); do server_runs+=("server-alone $mode"); done
  fi
  [[ ${SERVER_FLOOR:-1} != 0 ]] && server_runs+=("server-floor native")
  repeats=${SERVER_REPEATS:-1}
  for ((r = 0; r < repeats; r++)); do
    suffix=""; ((r > 0)) && suffix=".$((r + 1))"
    for ((k = 0; k < ${#server_runs[@]}; k++)); do
      read -r part mode <<<"${server_runs[$(( (k + r) % ${#server_runs[@]} ))]}"
      case $part in
        server) PEAKS="$batch $trainer_gib"; what="server beside a trainer: $mode"
                launch_jobs=(2 server trainer) ;;
        server-alone) PEAKS="$batch $trainer_gib"; what="server alone: $mode"
                      launch_jobs=(1 server) ;;
        server-floor) PEAKS="$(python -c "print($batch / 2)") $trainer_gib"
                      what="server floor: native, ${PEAKS} GiB"; launch_jobs=(2 server trainer) ;;
      esac
      step "$what${suffix:+ (repeat $((r + 1)) of $repeats)}"
      launch "$part$suffix" "$mode" "${launch_jobs[@]}"  # N, then each job's kind
    done
  done
  pack packing
fi
stop_daemon
grep -E "reclaim|short by" "$daemon_log" | tail -40 > "$out/packing/reclaims.log"
python "$here/summarize_packing.py" "$out" | tee "$out/packing.md"
pack packing
