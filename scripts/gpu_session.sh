#!/usr/bin/env bash
# One GPU check session, prepared on a machine without a GPU and run on a lent
# GPU machine that has no compiler dependencies of ours (docs/benchmarks.md).
#
#   scripts/gpu_session.sh --prepare [--nccl-lib FILE]
#       Here (no GPU needed; nvcc needs none): builds the CUDA binaries in Release
#       (build-gpu/), and packs into .gpu/ (git-ignored; carry it) the binaries,
#       the CUDA test programs and the shared libraries the GPU machine lacks
#       (oneDNN, OpenBLAS and theirs, xz-compressed), the CUDA plugins in
#       lib/ddprun, and the CUDA wheel (-C ddprun.cuda=true), each binary's run path set
#       to .gpu/lib first (DT_RPATH, ahead of LD_LIBRARY_PATH). --nccl-lib adds a
#       libnccl.so.2 (e.g. NCCL >= 2.30 for two ranks on one GPU) to that lib.
#   scripts/gpu_session.sh --run [--only STAGES] [--skip STAGES] [--out DIR] [--budget S]
#                                [--bench-args "ARGS"]   (more resnet_bench.py flags)
#       On the GPU machine, from the repository root with .gpu/ carried: unpacks,
#       finds NVIDIA's libraries in the PyTorch environment (cuDNN, cuBLAS, CUPTI,
#       NCCL: nothing system-wide is needed), then runs the stages in order, each
#       under its own time limit, and rewrites DIR/gpu_session.json after every
#       stage (an interrupted run still leaves its data). A short table is
#       printed last. STAGES: comma-separated names of
#         versions   GPU, driver, CUDA, cuDNN, NCCL (ours and PyTorch's), PyTorch
#         quicktests cuda_smoke_test, cuda_optim_tests
#         kernels    bn_kernel_bench: the NHWC batch norm kernels on ResNet-18's
#                    layers against a copy of the same bytes, each direction unfolded,
#                    folded and folded under programmatic dependent launch
#                    (DIR/bn_kernel_bench.json)
#         fusionprobe cudnn_fusion_probe: which of cuDNN's runtime-fusion patterns
#                    this GPU's cuDNN supports (DIR/cudnn_fusion_probe.json)
#         convlog    the convolution algorithms chosen for ResNet-18 (tf32, fp32,
#                    tf32 through cuDNN's graph-API engines)
#         allreduce  allreduce_perf, NCCL against CUDA IPC, 2 ranks on the GPU
#         bench      scripts/bench/resnet_bench.py --device cuda, the goal cases
#                    (both sides alternating, 3 rounds, the loss-parity check,
#                    profiles, kernel traces, the comm model; torch.compile's
#                    cold compile of ResNet-18 in tf32 and bf16 makes it the
#                    longest stage: give it a call of its own when time is short)
#         benchextras the A/B extra cases, one round each, merged into its JSON
#         wheel      the CUDA wheel (pip install --no-deps), train --device cuda
#                    on 1 and 2 ranks with no LD_LIBRARY_PATH, every CUDA
#                    library loaded from site-packages/nvidia (LD_DEBUG=libs)
#         tests      cuda_train_tests
#         traintests tests/cuda/train_gpu_test.py: CPU == CUDA, 2 ranks == 1 rank
#                    at twice the batch (CUDA IPC, and NCCL on one GPU), resume
#                    after kill -9 bitwise, checkpoints across devices, fp16, and
#                    the opt-in paths' A/Bs bitwise (folded sums, PDL, the fused
#                    stem, recompute, CUDA graphs with the optimizer): give it a
#                    call of its own
#         nccl       the NCCL version, the CUDA collective matrix (IPC, NCCL)
#       DIR defaults to $OUT (the device tool's output folder) or gpu-out/.
# Exit status: 0 when every stage that ran passed, 1 otherwise, 2 bad flags, 3
# no GPU (--run) or nothing to pack (--prepare).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mode="" only="" skip="" out="${OUT:-$root/gpu-out}" ncclLib="" budget=510 benchArgs=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prepare) mode=prepare; shift ;;
    --run) mode=run; shift ;;
    --only) only=$2; shift 2 ;;
    --skip) skip=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --nccl-lib) ncclLib=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --bench-args) benchArgs=$2; shift 2 ;;
    -h|--help) sed -n 2,51p "$0"; exit 0 ;;
    *) echo "gpu_session.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$mode" ] || { echo "gpu_session.sh: give --prepare or --run (see --help)" >&2; exit 2; }
pack="$root/.gpu"

# ------------------------------------------------------------------ prepare
# Programs the session runs, and the libraries of ours they need that a bare
# GPU machine with PyTorch does not have. NVIDIA's own (cuDNN, cuBLAS, NCCL,
# CUPTI) come from PyTorch's environment there, not from here.
programs=(ddprun train allreduce_perf coll_check cuda_smoke_test cuda_train_tests
          cuda_optim_tests bn_kernel_bench cudnn_fusion_probe)
bundled='libdnnl|libopenblas|libgfortran|libquadmath|libgomp|libOpenCL|libboost|libjpeg|libpng'

prepare() {
  command -v patchelf >/dev/null || { echo "gpu_session: installing patchelf"; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq patchelf >/dev/null || exit 3; }
  "$root/scripts/setup.sh" >/dev/null || exit 3
  cmake -S "$root" -B "$root/build-gpu" -DDDPRUN_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
        -DDDPRUN_BUILD_TESTS=ON >/dev/null || exit 3
  local targets=()
  for p in "${programs[@]}"; do targets+=(--target "$p"); done
  cmake --build "$root/build-gpu" -j"$(nproc)" "${targets[@]}" --target ddprun_kernel_trace \
    || exit 3
  local stage; stage=$(mktemp -d)
  mkdir -p "$stage/bin" "$stage/lib"
  for p in "${programs[@]}"; do
    [ -x "$root/build-gpu/bin/$p" ] || { echo "gpu_session: $p was not built" >&2; continue; }
    cp "$root/build-gpu/bin/$p" "$stage/bin/"
  done
  find "$root/build-gpu" -name 'libddprun_kernel_trace.so' -exec cp {} "$stage/bin/" \; -quit
  # The CUDA plugins (loaded at run time from <bin>/../lib/ddprun).
  mkdir -p "$stage/lib/ddprun"
  cp "$root"/build-gpu/lib/ddprun/libddprun_*_cuda.so "$stage/lib/ddprun/" || exit 3
  # The CUDA wheel, installed there with --no-deps on PyTorch's NVIDIA packages.
  local wvenv="$root/build-gpu/wheel-venv"
  [ -x "$wvenv/bin/pip" ] || python3 -m venv "$wvenv" || exit 3
  rm -rf "$root/build-gpu/wheelhouse"
  "$wvenv/bin/pip" wheel -q --no-deps --disable-pip-version-check -w "$root/build-gpu/wheelhouse" \
    "$root" -C ddprun.cuda=true -C build-dir="$root/build-gpu/wheel" \
    -C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache \
    -C cmake.define.CMAKE_CUDA_COMPILER_LAUNCHER=ccache || exit 3
  # Unpacked, so that xz's long window stores the wheel's copies of oneDNN and
  # OpenBLAS as near-repeats of lib/'s (a .whl is already deflated: packed as is,
  # the carry is over the 64 MiB a call takes). --run zips it again.
  local whl; whl=$(ls "$root"/build-gpu/wheelhouse/*.whl | head -1)
  mkdir -p "$stage/wheel/tree" && basename "$whl" > "$stage/wheel/name" \
    && unzip -q "$whl" -d "$stage/wheel/tree" || exit 3
  # Libraries of ours the binaries load, resolved here.
  for f in "$stage"/bin/*; do
    ldd "$f" 2>/dev/null | awk '{print $3}' | grep -E "$bundled" || true
  done | sort -u | while read -r lib; do cp -L "$lib" "$stage/lib/"; done
  if [ -n "$ncclLib" ]; then
    cp -L "$ncclLib" "$stage/lib/libnccl.so.2" || exit 3
  fi
  for f in "$stage"/bin/* "$stage"/lib/*; do
    [ -f "$f" ] || continue
    strip --strip-unneeded "$f" 2>/dev/null || true
    patchelf --force-rpath --set-rpath '$ORIGIN/../lib:$ORIGIN' "$f" 2>/dev/null || true
  done
  for f in "$stage"/lib/ddprun/*; do  # NCCL carried in lib/ wins; NVIDIA's via LD_LIBRARY_PATH
    strip --strip-unneeded "$f" 2>/dev/null || true
    patchelf --force-rpath --set-rpath '$ORIGIN/..' "$f" 2>/dev/null || true
  done
  rm -rf "$pack" && mkdir -p "$pack"
  tar -C "$stage" -cf - lib bin wheel | xz -T1 --lzma2=preset=9e,dict=256MiB > "$pack/carry.tar.xz" || exit 3
  # The commit, "-dirty" when tracked files differ from it (the figures'
  # JSON records both: bench_harness.tree_state).
  { git -C "$root" rev-parse HEAD | tr -d '\n'
    [ -n "$(git -C "$root" status --porcelain --untracked-files=no)" ] && printf -- -dirty
    echo; } > "$pack/commit" 2>/dev/null || true
  rm -rf "$stage"
  grep -qx '/.gpu/' "$root/.git/info/exclude" 2>/dev/null || echo '/.gpu/' >> "$root/.git/info/exclude"
  echo "gpu_session: packed $(du -h "$pack/carry.tar.xz" | cut -f1) into .gpu/ (commit $(cat "$pack/commit" 2>/dev/null))"
  echo "run there: scripts/gpu_session.sh --run   (carry .gpu)"
}

# ---------------------------------------------------------------------- run
summary=""   # the JSON summary file
declare -a rows=()
stage_wanted() {
  local s=$1
  if [ -n "$only" ] && [[ ",$only," != *",$s,"* ]]; then return 1; fi
  if [ -n "$skip" ] && [[ ",$skip," == *",$s,"* ]]; then return 1; fi
  return 0
}
# record NAME RC SECONDS NOTE: appends to the summary (rewritten at once).
record() {
  python3 - "$summary" "$1" "$2" "$3" "$4" <<'EOF'
import json, os, sys
path, name, rc, secs, note = sys.argv[1:6]
d = json.load(open(path)) if os.path.exists(path) else {"stages": []}
d["stages"].append({"name": name, "rc": int(rc), "seconds": float(secs), "note": note})
json.dump(d, open(path + ".tmp", "w"), indent=1)
os.replace(path + ".tmp", path)
EOF
  local verdict=ok
  [ "$2" = 77 ] && verdict=skip
  [ "$2" != 0 ] && [ "$2" != 77 ] && verdict=FAIL:$2
  rows+=("$(printf '%-10s %-7s %5ss  %s' "$1" "$verdict" "$3" "$4")")
}
# stage NAME LIMIT COMMAND...: runs it with a time limit, logs to logs/NAME.log
# The whole run stays inside --budget seconds (default 510: the device tool's
# 9-minute runs with room to pack the logs): a stage gets at most what is
# left, and one with under 20 s left is recorded as skipped.
stage() {
  local name=$1 limit=$2; shift 2
  stage_wanted "$name" || return 0
  local left=$((budget - (SECONDS - start)))
  if [ "$left" -lt 20 ]; then
    record "$name" 0 0 "SKIPPED: the session's ${budget}s budget is spent"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "=== $name (limit ${limit}s)"
  local t0=$SECONDS
  # Shell functions (versions, gtest_prog) reach the timed child through export -f.
  if declare -F "$1" >/dev/null; then set -- bash -c "$*"; fi
  timeout --kill-after=10 "$limit" "$@" > >(tee "$logs/$name.log") 2>&1
  local rc=$?
  local note
  note=$(grep -E '^(PASSED|FAILED|SUMMARY|\[  PASSED|\[  FAILED|OK|Ran )' "$logs/$name.log" | tail -3 | tr '\n' ' ' | cut -c1-200)
  [ "$rc" = 124 ] && note="TIMED OUT after ${limit}s; $note"
  [ "$rc" = 77 ] && note="SKIPPED (every test skipped); $note"
  record "$name" "$rc" "$((SECONDS - t0))" "$note"
  [ "$rc" = 0 ] || [ "$rc" = 77 ] || status=1
}

versions() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) x $(nproc)"
  python3 - <<'EOF'
import ctypes, json, os, torch
v = {"torch": torch.__version__, "cuda": torch.version.cuda}
for k, f in (("cudnn_torch", lambda: torch.backends.cudnn.version()),
             ("nccl_torch", lambda: ".".join(map(str, torch.cuda.nccl.version()))),
             ("gpu", lambda: torch.cuda.get_device_name(0))):
    try:
        v[k] = f()
    except Exception as e:  # one missing figure must not hide the others
        v[k] = "unknown: %s" % e
for name, lib in (("nccl_ours", os.environ.get("GPU_SESSION_NCCL", "")),):
    try:
        h = ctypes.CDLL(lib); n = ctypes.c_int(); h.ncclGetVersion(ctypes.byref(n))
        x = n.value; v[name] = "%d.%d.%d" % (x // 10000, x // 100 % 100, x % 100)
    except OSError as e:
        v[name] = "not loadable: %s" % e
print("VERSIONS " + json.dumps(v))
EOF
  "$bin/train" --help >/dev/null && echo "OK train runs here"
}

# The CUDA wheel as a user gets it: pip install --no-deps into the Python
# environment that has NVIDIA's packages, run with no LD_LIBRARY_PATH (the
# plugins' RPATHs find them), one rank and two ranks on the GPU; every CUDA
# library the run loads must come from site-packages/nvidia.
wheel_check() {
  set -eo pipefail
  local w s libs
  w=/tmp/gpu_session/wheel/$(cat /tmp/gpu_session/wheel/name)
  (cd /tmp/gpu_session/wheel/tree && python3 -m zipfile -c "$w" ./*)
  python3 -m pip install -q --no-deps --no-index --force-reinstall "$w"
  s=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
  local flags=(--device cuda --model lenet-bn --data synthetic --epochs 1 --quiet)
  env -u LD_LIBRARY_PATH "$s/train" "${flags[@]}" --max-steps 40 | tail -1
  env -u LD_LIBRARY_PATH "$s/ddprun" --standalone --nproc_per_node=2 "$s/train" "${flags[@]}" \
    --max-steps 40 | tail -1
  libs=$(env -u LD_LIBRARY_PATH LD_DEBUG=libs "$s/train" "${flags[@]}" --max-steps 2 2>&1 \
    | grep -E 'calling init: .*lib(cudart|cudnn|cublasLt|nccl)[^/]*$' \
    | sed 's/.*calling init: //' | xargs -r realpath -s -m | sort -u)
  echo "$libs"
  [ -n "$libs" ] || { echo "FAILED: no CUDA library seen loading (LD_DEBUG=libs)"; return 1; }
  if echo "$libs" | grep -vq site-packages/nvidia; then
    echo "FAILED: a CUDA library came from outside site-packages/nvidia"; return 1
  fi
  echo "OK the wheel trains on the GPU, its CUDA libraries from site-packages/nvidia"
}

gtest_prog() {  # gtest_prog PROGRAM [FILTER]
  [ -x "$bin/$1" ] || { echo "SKIPPED: $1 not packed"; return 0; }
  "$bin/$1" --gtest_brief=1 ${2:+--gtest_filter=$2}
}

run() {
  nvidia-smi -L >/dev/null 2>&1 || { echo "gpu_session: no NVIDIA GPU visible" >&2; exit 3; }
  [ -f "$pack/carry.tar.xz" ] || { echo "gpu_session: .gpu/carry.tar.xz missing: run --prepare here and carry .gpu" >&2; exit 3; }
  mkdir -p "$out"; logs=$(mktemp -d); summary="$out/gpu_session.json"; rm -f "$summary"
  local t0=$SECONDS
  start=$SECONDS
  mkdir -p /tmp/gpu_session && tar -C /tmp/gpu_session -xJf "$pack/carry.tar.xz" || exit 3
  bin=/tmp/gpu_session/bin
  # NVIDIA's libraries from PyTorch's environment: every nvidia/*/lib folder
  # but NCCL's when we carry our own (DT_RPATH of our binaries finds ours first
  # anyway; PyTorch keeps its own through its RPATH).
  local nv
  nv=$(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, d, "lib") for p in nvidia.__path__ for d in sorted(os.listdir(p)) if os.path.isdir(os.path.join(p, d, "lib"))))' 2>/dev/null)
  [ -n "$nv" ] || echo "gpu_session: no nvidia/*/lib in $(command -v python3)'s environment: NVIDIA's libraries must come from the system" >&2
  for d in $nv; do LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"; done
  export LD_LIBRARY_PATH DDPRUN_BIN_DIR="$bin" PYTHONUNBUFFERED=1
  export GPU_SESSION_NCCL
  GPU_SESSION_NCCL=$( [ -f /tmp/gpu_session/lib/libnccl.so.2 ] && echo /tmp/gpu_session/lib/libnccl.so.2 || \
    (for d in $nv; do [ -f "$d/libnccl.so.2" ] && echo "$d/libnccl.so.2" && break; done) )
  export DDPRUN_BENCH_COMMIT; DDPRUN_BENCH_COMMIT=$(cat "$pack/commit" 2>/dev/null || echo unknown)
  export -f versions gtest_prog wheel_check
  export bin
  status=0
  record unpack 0 "$((SECONDS - t0))" "commit $DDPRUN_BENCH_COMMIT"
  stage versions 40 versions
  # A quick sanity of the new device code first (seconds), then the figures,
  # then the long correctness tests: an interrupted session keeps the most.
  stage quicktests 60 bash -c "gtest_prog cuda_smoke_test && gtest_prog cuda_optim_tests"
  # The batch norm kernels alone against the copy rate (seconds).
  stage kernels 90 bash -c "'$bin/bn_kernel_bench' --out '$out/bn_kernel_bench.json' && \
    python3 '$root/scripts/bench/bench_harness.py' '$out/bn_kernel_bench.json' \
      --commit '$DDPRUN_BENCH_COMMIT'"
  stage fusionprobe 60 "$bin/cudnn_fusion_probe" --out "$out/cudnn_fusion_probe.json"
  # tf32-graph: the same through cuDNN's graph-API engines (DDPRUN_CUDNN_GRAPH=1),
  # to set the stem's backward-filter choice beside the legacy search's.
  stage convlog 90 bash -c "for v in tf32 fp32 tf32-graph; do p=\${v%-graph}; \
    g=\$([ \$v = \$p ] && echo 0 || echo 1); DDPRUN_CONV_LOG=1 DDPRUN_CUDNN_GRAPH=\$g \
    '$bin/train' --device cuda \
    --model resnet18 --data synthetic-cifar --image-size 224 --batch-size 128 --precision \$p \
    --max-steps 3 --train-samples 384 --test-samples 128 --quiet 2>&1 | grep -v '^{' | sed \"s/^/\$v /\"; \
    done"
  stage allreduce 90 bash -c "rc=0; for t in nccl ipc; do DDPRUN_CUDA_TRANSPORT=\$t '$bin/ddprun' \
    --standalone --nproc_per_node=2 --no_python '$bin/allreduce_perf' -d cuda -b 1M -e 64M -f 2 \
    --json > '$logs/allreduce_'\$t.jsonl || rc=1; tail -n 3 '$logs/allreduce_'\$t.jsonl; done; exit \$rc"
  # The goal cases, 3 alternating rounds each (median and spread); PyTorch's two
  # ranks on the NCCL ours runs (LD_PRELOAD) when we carry one, gloo beside it.
  local preload=()
  [ -f /tmp/gpu_session/lib/libnccl.so.2 ] && preload=(--torch-nccl-preload /tmp/gpu_session/lib/libnccl.so.2)
  stage bench 420 python3 "$root/scripts/bench/resnet_bench.py" --device cuda --out "$out" \
    --python python3 --timeout 150 --commit "$DDPRUN_BENCH_COMMIT" --no-extras \
    --allreduce-jsonl "nccl=$logs/allreduce_nccl.jsonl" --allreduce-jsonl "ipc=$logs/allreduce_ipc.jsonl" \
    "${preload[@]}" $benchArgs
  # The A/B extras, one round each, merged into the same JSON.
  stage benchextras 240 python3 "$root/scripts/bench/resnet_bench.py" --device cuda --out "$out" \
    --python python3 --timeout 150 --commit "$DDPRUN_BENCH_COMMIT" --extras-only --merge \
    --kernel-trace off $benchArgs
  stage wheel 90 wheel_check
  stage tests 150 bash -c "gtest_prog cuda_train_tests"
  stage traintests 420 python3 "$root/tests/cuda/train_gpu_test.py"
  stage nccl 150 bash -c "'$bin/coll_check' --nccl-version && \
    python3 '$root/tests/runtime/runtime_test.py' CudaMatrix"
  (cd "$logs" && tar -czf "$out/gpu_session_logs.tar.gz" ./*.log ./*.jsonl 2>/dev/null)
  echo
  echo "GPU session summary ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $((SECONDS - t0)) s):"
  printf '%s\n' "${rows[@]}"
  [ -f "$out/resnet_bench_cuda.md" ] && cat "$out/resnet_bench_cuda.md"
  return $status
}

case "$mode" in
  prepare) prepare ;;
  run) run; exit $? ;;
esac
