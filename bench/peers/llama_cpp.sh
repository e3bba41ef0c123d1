#!/usr/bin/env bash
# llama.cpp as a peer for kiln's decode/prefill benchmarks.
#
# The llama.cpp source is the one that PyPI's llama-cpp-python source
# distribution vendors (pinned below).  Everything is built and kept outside
# kiln's build, under $KILN_PEERS_DIR (default: <repo>/build-peers, which
# .gitignore's /build*/ ignores).  See bench/peers/README.md.
#
#   fetch               CPU machine, network: pip-download the sdist, extract vendor/llama.cpp
#   build [cuda|cpu]    CPU machine: configure + build only llama-bench (cuda: sm_90a; cpu: a test build)
#   pack [cuda|cpu]     CPU machine: llama-bench + converter into carry/ and llama-cpp-peer.tar.xz
#   unpack              GPU machine: extract the tarball into carry/ (model and bench do it themselves)
#   model CONFIG OUTDIR GPU machine (or here, on a tiny config): random-weight HF checkpoint
#                       in OUTDIR/<config name>/, converted by llama.cpp's own converter to OUTDIR/model-bf16.gguf
#   bench GGUF OUTJSON  GPU machine: llama-bench pp 1024/8192/30000, tg at depth 1024/8192/30000
#   selftest            CPU machine: model + bench on a tiny config with the CPU build
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
SDIST=llama_cpp_python-${LLAMA_CPP_PYTHON_VERSION}.tar.gz

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PEERS=${KILN_PEERS_DIR:-$REPO/build-peers}
SRC=$PEERS/llama.cpp                    # the vendored llama.cpp source tree
CARRY=$PEERS/carry                      # what travels to the GPU machine
TARBALL=$PEERS/llama-cpp-peer.tar.xz
JOBS=${KILN_PEERS_JOBS:-1}              # the CPU machine has 2 cores shared with kiln's own builds
PYTHON=${PYTHON:-python3}
CARRY_BUDGET_BYTES=$((18 * 1000 * 1000))

log() { echo "llama_cpp.sh: $*" >&2; }
die() { echo "llama_cpp.sh: error: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "'$1' not found on PATH${2:+ ($2)}"; }

# Run a heavy command at the lowest priority.  'nice' alone is not enough
# here: with the kernel's autogroup scheduling (Debian's default) CPU time is
# shared between sessions first, so a niced build in one terminal still takes
# a full core from builds in another.  A new session whose autogroup is niced
# to 19 only gets what the others leave idle.
polite() {
  setsid --wait bash -c 'echo 19 >/proc/self/autogroup 2>/dev/null || true; exec nice -n 19 "$@"' polite "$@"
}

usage() {
  sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

# ---------------------------------------------------------------- fetch
cmd_fetch() {
  need "$PYTHON"
  mkdir -p "$PEERS/dl"
  if [[ ! -f $PEERS/dl/$SDIST ]]; then
    log "downloading llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (sdist) into $PEERS/dl"
    # pip prepares the sdist's metadata, which needs its build backend: pip
    # fetches that into a throwaway isolated environment; nothing is installed.
    polite "$PYTHON" -m pip download --quiet --no-binary :all: --no-deps \
      --dest "$PEERS/dl" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" ||
      die "pip download of llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION failed (network? PyPI?)"
  fi
  [[ -f $PEERS/dl/$SDIST ]] || die "pip did not leave $PEERS/dl/$SDIST"
  echo "$LLAMA_CPP_PYTHON_SHA256  $PEERS/dl/$SDIST" | sha256sum --check --quiet ||
    die "$SDIST does not have the pinned sha256 $LLAMA_CPP_PYTHON_SHA256"

  local top=llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION
  # Extracting again would touch every file and so rebuild everything.
  if grep -qs "^llama-cpp-python $LLAMA_CPP_PYTHON_VERSION " "$SRC/KILN_PEER_VERSION"; then
    log "$SRC already holds llama-cpp-python $LLAMA_CPP_PYTHON_VERSION's llama.cpp"
    return 0
  fi
  rm -rf "$SRC" "$SRC.tmp"
  mkdir -p "$SRC.tmp"
  tar -xzf "$PEERS/dl/$SDIST" -C "$SRC.tmp" \
    "$top/vendor/llama.cpp" "$top/.git/modules/vendor/llama.cpp/HEAD"
  [[ -f $SRC.tmp/$top/vendor/llama.cpp/CMakeLists.txt ]] || die "$SDIST has no vendor/llama.cpp"
  local commit
  commit=$(tr -d '[:space:]' <"$SRC.tmp/$top/.git/modules/vendor/llama.cpp/HEAD")
  mv "$SRC.tmp/$top/vendor/llama.cpp" "$SRC"
  rm -rf "$SRC.tmp"
  # The sdist's submodule .git file points into a folder that is not extracted.
  rm -f "$SRC/.git"
  {
    echo "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION (PyPI sdist, sha256 $LLAMA_CPP_PYTHON_SHA256)"
    echo "llama.cpp commit $commit"
  } >"$SRC/KILN_PEER_VERSION"
  log "llama.cpp $commit (from llama-cpp-python $LLAMA_CPP_PYTHON_VERSION) is in $SRC"
}

# ---------------------------------------------------------------- build
cmd_build() {
  local flavour=${1:-cuda}
  [[ -f $SRC/CMakeLists.txt ]] || die "no llama.cpp source in $SRC: run '$0 fetch' first"
  need cmake
  local dir=$PEERS/build-$flavour
  local args=(
    -S "$SRC" -B "$dir"
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=OFF
    # A binary for another machine: no -march=native.  This turns on ggml's
    # portable x86-64 default instead (SSE4.2, AVX, AVX2, BMI2, FMA, F16C),
    # which any x86-64 server of the last ten years runs; with -ngl 99 the CPU
    # backend does next to nothing anyway.
    -DGGML_NATIVE=OFF
    -DGGML_OPENMP=OFF                   # ggml's own thread pool: no libgomp needed there
    -DGGML_CCACHE=OFF
    -DLLAMA_OPENSSL=OFF                 # no HTTPS model downloads (this version has no LLAMA_CURL any more)
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
    -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON
    # The GPU machine has a newer glibc and libstdc++; linking the C++ runtime
    # statically removes even that question.
    -DCMAKE_EXE_LINKER_FLAGS="-static-libstdc++ -static-libgcc"
  )
  case $flavour in
    cuda)
      local nvcc=${CUDACXX:-}
      if [[ -z $nvcc ]]; then
        nvcc=$(command -v nvcc || true)
        [[ -n $nvcc ]] || nvcc=$(ls -d /usr/local/cuda/bin/nvcc 2>/dev/null || true)
      fi
      [[ -x $nvcc ]] || die "nvcc not found (set CUDACXX or put the CUDA toolkit's bin on PATH)"
      args+=(
        -DGGML_CUDA=ON
        -DCMAKE_CUDA_COMPILER="$nvcc"
        # H200 only, machine code only (no PTX: sm_90a PTX runs nowhere else either).
        -DCMAKE_CUDA_ARCHITECTURES=90a-real
        # FlashAttention vector (decode) kernels for f16 and bf16 KV caches
        # only; the default adds q4_0/q8_0 caches, which this benchmark never uses.
        -DGGML_CUDA_FA_QUANTS=f16-f16,bf16-bf16
        -DGGML_CUDA_NCCL=OFF            # one GPU; no libnccl needed there
        # nvcc's own fatbin compression.  'none' makes the binary 3x larger but
        # the xz tarball ~18% smaller on the kernels (xz packs raw SASS better
        # than nvcc does); changing it recompiles every .cu file.
        -DGGML_CUDA_COMPRESSION_MODE="${KILN_PEER_CUDA_COMPRESSION:-size}"
      )
      ;;
    cpu) args+=(-DGGML_CUDA=OFF) ;;
    *) die "build: unknown flavour '$flavour' (cuda or cpu)" ;;
  esac
  local gen=()
  command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  # Configured every time, so the cache follows this script (same options: nothing rebuilds).
  [[ -f $dir/CMakeCache.txt ]] && gen=()  # the generator cannot change in an existing build folder
  log "configuring $flavour build in $dir"
  # GIT_DIR: llama.cpp's build-info asks git for its commit, and git would
  # answer with kiln's own commit (build-peers sits inside kiln's checkout).
  GIT_DIR=/nonexistent polite cmake "${gen[@]}" "${args[@]}" >"$dir.configure.log" 2>&1 ||
    { tail -30 "$dir.configure.log" >&2; die "cmake configure failed; see $dir.configure.log"; }
  log "building llama-bench ($flavour, -j$JOBS, lowest priority) in $dir; log: $dir.build.log"
  GIT_DIR=/nonexistent polite cmake --build "$dir" --target llama-bench -j "$JOBS" \
    >>"$dir.build.log" 2>&1 ||
    { tail -30 "$dir.build.log" >&2; die "build failed; see $dir.build.log"; }
  [[ -x $dir/bin/llama-bench ]] || die "build finished but $dir/bin/llama-bench is missing"
  log "built $dir/bin/llama-bench"
}

# ---------------------------------------------------------------- pack
cmd_pack() {
  local flavour=${1:-cuda}              # 'pack cpu' packs the CPU build, to test the tarball here
  local bin=$PEERS/build-$flavour/bin/llama-bench
  [[ -x $bin ]] || die "no $flavour llama-bench at $bin: run '$0 build $flavour' first"
  [[ -f $SRC/convert_hf_to_gguf.py ]] || die "no llama.cpp source in $SRC: run '$0 fetch' first"
  need xz
  rm -rf "$CARRY"
  mkdir -p "$CARRY/bin" "$CARRY/convert"
  cp "$bin" "$CARRY/bin/llama-bench"
  strip --strip-unneeded "$CARRY/bin/llama-bench"
  # The converter: the script, its 'conversion' package and the vendored gguf
  # package, all pure Python.  Its other imports (torch, numpy, transformers,
  # sentencepiece, yaml, tqdm) are on the GPU machine already.
  cp "$SRC/convert_hf_to_gguf.py" "$CARRY/convert/"
  (cd "$SRC" && find conversion gguf-py/gguf -name '*.py' -o -name py.typed) |
    while read -r f; do install -D -m 644 "$SRC/$f" "$CARRY/convert/$f"; done
  cp "$SRC/LICENSE" "$CARRY/LICENSE.llama.cpp"
  {
    cat "$SRC/KILN_PEER_VERSION"
    echo "llama-bench: $flavour build, $(date -u +%FT%TZ), $(. /etc/os-release && echo "$PRETTY_NAME")"
    grep -E '^(GGML_CUDA|CMAKE_CUDA_ARCHITECTURES|GGML_CUDA_FA_QUANTS|GGML_NATIVE|GGML_OPENMP|BUILD_SHARED_LIBS|CMAKE_BUILD_TYPE|CMAKE_CUDA_COMPILER_VERSION):' \
      "$PEERS/build-$flavour/CMakeCache.txt" || true
  } >"$CARRY/VERSION"
  log "compressing $TARBALL (xz, x86 filter + preset 9e, one thread, lowest priority)"
  polite bash -c 'tar -C "$1" -cf - carry | xz -T1 --x86 --lzma2=preset=9e,dict=64MiB >"$2"' \
    tar "$PEERS" "$TARBALL.tmp"
  mv "$TARBALL.tmp" "$TARBALL"
  local size
  size=$(stat -c %s "$TARBALL")
  log "llama-bench: $(stat -c %s "$CARRY/bin/llama-bench") bytes unpacked"
  echo "$TARBALL: $size bytes ($(numfmt --to=si "$size")B)"
  if ((size > CARRY_BUDGET_BYTES)); then
    log "WARNING: over the ${CARRY_BUDGET_BYTES}-byte carry budget"
  fi
}

# ---------------------------------------------------------------- unpack
# carry/ from the tarball, unless it is there already.
# The tarball travels either as build-peers/llama-cpp-peer.tar.xz or inside
# kiln's own .carry/ folder.
ensure_carry() {
  [[ -x $CARRY/bin/llama-bench && -f $CARRY/convert/convert_hf_to_gguf.py ]] && return 0
  local t
  for t in "$TARBALL" "$REPO/.carry/llama-cpp-peer.tar.xz"; do
    [[ -f $t ]] || continue
    log "unpacking $t"
    rm -rf "$CARRY"
    mkdir -p "$PEERS"
    tar -C "$PEERS" -xJf "$t"
    [[ -x $CARRY/bin/llama-bench ]] || die "$t holds no carry/bin/llama-bench"
    return 0
  done
  return 1
}
cmd_unpack() {
  ensure_carry || die "no $TARBALL nor $REPO/.carry/llama-cpp-peer.tar.xz (carry one; '$0 pack' makes it)"
  cat "$CARRY/VERSION"
}

# The converter: from carry/ (GPU machine), else from the source tree (CPU machine).
converter() {
  if ensure_carry && [[ -f $CARRY/convert/convert_hf_to_gguf.py ]]; then
    echo "$CARRY/convert/convert_hf_to_gguf.py"
  elif [[ -f $SRC/convert_hf_to_gguf.py ]]; then
    echo "$SRC/convert_hf_to_gguf.py"
  else
    die "no convert_hf_to_gguf.py: neither $CARRY (carry $TARBALL) nor $SRC (run '$0 fetch')"
  fi
}

# ---------------------------------------------------------------- model
cmd_model() {
  (($# == 2)) || die "usage: $0 model CONFIG.json OUTDIR"
  local config=$1 out=$2
  [[ -f $config ]] || die "no config file $config"
  need "$PYTHON"
  local conv
  conv=$(converter)
  "$PYTHON" -c 'import torch, numpy, transformers, sentencepiece, yaml, tqdm' 2>/dev/null ||
    die "$PYTHON lacks one of torch, numpy, transformers, sentencepiece, pyyaml, tqdm (the converter imports them all)"
  mkdir -p "$out"
  # The converter names the model (general.name) after this folder.
  local name
  name=$(basename "$config" .json)
  name=${name%.config}
  local hf=$out/$name
  log "writing a random-weight bf16 checkpoint for $config into $hf"
  "$PYTHON" "$HERE/random_hf_llama.py" "$config" "$hf" --seed "${KILN_PEER_SEED:-1234}"
  log "converting with $conv"
  # HF_HUB_OFFLINE: the converter reads the config through transformers, which must not look online.
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$PYTHON" "$conv" "$hf" \
    --outtype bf16 --outfile "$out/model-bf16.gguf" >"$out/convert.log" 2>&1 ||
    { tail -30 "$out/convert.log" >&2; die "convert_hf_to_gguf.py failed; see $out/convert.log"; }
  [[ -s $out/model-bf16.gguf ]] || die "the converter wrote no $out/model-bf16.gguf"
  echo "$out/model-bf16.gguf: $(stat -c %s "$out/model-bf16.gguf") bytes"
}

# ---------------------------------------------------------------- bench
# Make llama-bench's shared CUDA libraries (cudart, cuBLAS, the driver) findable.
cuda_lib_path() {
  local bin=$1 d path=""
  for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 \
    /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64; do
    [[ -d $d && :$path: != *:$d:* ]] && path+=${path:+:}$d
  done
  export LD_LIBRARY_PATH=$path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  local missing lib found site
  missing=$(ldd "$bin" | awk '/not found/ {print $1}')
  [[ -z $missing ]] && return 0
  # Still missing: look in Python's nvidia-* wheels (PyTorch's CUDA) and the usual roots.
  site=$("$PYTHON" -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)
  for lib in $missing; do
    found=$(find ${site:+"$site"} /usr/local /opt /usr/lib -name "$lib" -print -quit 2>/dev/null || true)
    [[ -n $found ]] && LD_LIBRARY_PATH=$(dirname "$found"):$LD_LIBRARY_PATH
  done
  missing=$(ldd "$bin" | awk '/not found/ {print $1}')
  [[ -z $missing ]] || die "llama-bench needs libraries not found on this machine: $missing"
  log "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
}

cmd_bench() {
  (($# == 2)) || die "usage: $0 bench MODEL.gguf OUT.json"
  local gguf=$1 outjson=$2
  [[ -s $gguf ]] || die "no GGUF file $gguf"
  local bin=${LLAMA_BENCH:-}
  if [[ -z $bin ]]; then
    ensure_carry || die "no llama-bench: carry $TARBALL (or set LLAMA_BENCH)"
    bin=$CARRY/bin/llama-bench
  fi
  [[ -x $bin ]] || die "llama-bench $bin is not executable"
  cuda_lib_path "$bin"

  # The test plan; each can be overridden (the CPU self-test uses tiny ones).
  local pp=${KILN_PEER_PP:-1024,8192,30000}      # prompt lengths, each from an empty cache
  local depths=${KILN_PEER_DEPTHS:-1024,8192,30000}  # cache depths for token generation
  local tg=${KILN_PEER_TG:-128}                   # tokens generated per tg test
  local reps=${KILN_PEER_REPS:-5}
  local ngl=${KILN_PEER_NGL:-99}
  # One 2048-token ubatch per pass: a 30000-token prompt runs as 15 passes.
  local ub=${KILN_PEER_UBATCH:-2048} b=${KILN_PEER_BATCH:-2048}
  local common=(-m "$gguf" -ngl "$ngl" -fa on -b "$b" -ub "$ub" -r "$reps" -o json)
  [[ -n ${KILN_PEER_THREADS:-} ]] && common+=(-t "$KILN_PEER_THREADS")

  mkdir -p "$(dirname "$outjson")"
  local tmp log=${outjson%.json}.log
  tmp=$(mktemp -d)
  BENCH_TMP=$tmp
  trap 'rm -rf "$BENCH_TMP"' EXIT
  : >"$log"
  "$bin" --list-devices >>"$log" 2>&1 || true
  # Two runs: llama-bench crosses every -p/-n with every -d, and we want
  # prompt processing from an empty cache only and generation at each depth only.
  log "pp $pp (depth 0)"
  echo "+ $bin ${common[*]} -p $pp -n 0 -d 0" >>"$log"
  "$bin" "${common[@]}" -p "$pp" -n 0 -d 0 >"$tmp/pp.json" 2>>"$log" ||
    { tail -30 "$log" >&2; die "llama-bench (prompt processing) failed; see $log"; }
  log "tg $tg at depths $depths"
  echo "+ $bin ${common[*]} -p 0 -n $tg -d $depths" >>"$log"
  "$bin" "${common[@]}" -p 0 -n "$tg" -d "$depths" >"$tmp/tg.json" 2>>"$log" ||
    { tail -30 "$log" >&2; die "llama-bench (token generation) failed; see $log"; }
  local version=unknown
  [[ -f $CARRY/VERSION ]] && version=$(head -2 "$CARRY/VERSION" | paste -sd';')
  [[ $version == unknown && -f $SRC/KILN_PEER_VERSION ]] && version=$(paste -sd';' "$SRC/KILN_PEER_VERSION")
  "$PYTHON" "$HERE/llama_bench_summary.py" --source "$version" --out "$outjson" "$tmp/pp.json" "$tmp/tg.json"
}

# ---------------------------------------------------------------- selftest
# CPU machine: the whole model -> GGUF -> llama-bench path on a tiny config,
# with the CPU build ('build cpu') and a few short tests.
cmd_selftest() {
  local bin=$PEERS/build-cpu/bin/llama-bench out=$PEERS/selftest
  [[ -x $bin ]] || die "no CPU llama-bench at $bin: run '$0 build cpu' first"
  cmd_model "$HERE/tiny-llama.config.json" "$out"
  LLAMA_BENCH=$bin KILN_PEER_NGL=0 KILN_PEER_PP=64,128 KILN_PEER_DEPTHS=64,128 KILN_PEER_TG=16 \
    KILN_PEER_REPS=2 KILN_PEER_UBATCH=64 KILN_PEER_BATCH=64 cmd_bench "$out/model-bf16.gguf" "$out/bench.json"
}

# ---------------------------------------------------------------- main
(($# >= 1)) || usage 1
sub=$1
shift
case $sub in
  fetch) cmd_fetch "$@" ;;
  build) cmd_build "$@" ;;
  pack) cmd_pack "$@" ;;
  unpack) cmd_unpack "$@" ;;
  model) cmd_model "$@" ;;
  bench) cmd_bench "$@" ;;
  selftest) cmd_selftest "$@" ;;
  -h | --help | help) usage 0 ;;
  *) echo "llama_cpp.sh: unknown subcommand '$sub'" >&2; usage 1 ;;
esac
