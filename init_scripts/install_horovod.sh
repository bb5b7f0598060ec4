#!/usr/bin/env bash
# Builds and installs Horovod 0.28.1 (PyTorch + MPI + Gloo, no TensorFlow/MXNet) into the
# Python environment of $PYTHON, against the torch already installed there.
#
# Horovod 0.28.1 is the last release and ships as an sdist only. torch 2.x headers need
# C++17 but the sdist asks for C++14 (fixed upstream after 0.28.1, never released), so the
# sdist is patched (CMAKE_CXX_STANDARD 14 -> 17) before `pip wheel --no-build-isolation`.
# TensorFlow is left out on purpose: Horovod's TF binding does not work with TF >= 2.16.
#
# Paths, fastest first:
#   1. Horovod of the right version with a working torch binding (built for this torch,
#      with Gloo, and with MPI when wanted) is already installed: nothing to do (seconds).
#   2. A wheel built earlier for the same Horovod/torch/Python/MPI/arch is in the cache:
#      install it (seconds).
#   3. Otherwise download the sdist, patch, build (10-25 min on 2 cores), cache the wheel,
#      install it.
# After 2 and 3 it runs `horovodrun --check-build` and fails unless PyTorch, MPI and Gloo
# are all available.
#
# Usable as a Databricks cluster init script (PYTHON then defaults to
# /databricks/python/bin/python). Needs Open MPI, cmake and g++ (init_scripts/install_system.sh).
#
# Environment:
#   PYTHON                          interpreter whose environment gets Horovod
#                                   (default /databricks/python/bin/python if present, else python3)
#   SPARKDIST_CACHE                 cache root (default ~/.cache/sparkdist); wheels go to
#                                   $SPARKDIST_CACHE/wheels/<key>/
#   SPARKDIST_INIT_LOG              log file (default /tmp/sparkdist-init.log)
#   SPARKDIST_HOROVOD_WITHOUT_MPI=1 build/accept a Gloo-only Horovod (default: MPI required)
#   SPARKDIST_HOROVOD_NO_BUILD=1    never build from source: fail when no cached wheel fits
#   SPARKDIST_HOROVOD_FORCE_BUILD=1 ignore the installed copy and the cache, rebuild
#   MAKEFLAGS                       default -j<min(nproc, available GiB / 1.5)>
#   HOROVOD_BUILD_ARCH_FLAGS        passed through; unset = Horovod picks -mf16c/-mavx/-mfma
#                                   as far as this CPU supports them
set -euo pipefail

HOROVOD_VERSION=0.28.1

LOG=${SPARKDIST_INIT_LOG:-/tmp/sparkdist-init.log}
mkdir -p "$(dirname "$LOG")"
log() { echo "[sparkdist install_horovod] $*" | tee -a "$LOG" >&2; }
fail() { log "FAILED: $*"; exit 1; }
trap 'fail "unexpected error (exit $?) at line $LINENO: $BASH_COMMAND (see $LOG)"' ERR

started=$SECONDS

# --- the Python environment ------------------------------------------------------------
if [ -z "${PYTHON:-}" ]; then
  if [ -x /databricks/python/bin/python ]; then
    PYTHON=/databricks/python/bin/python
  else
    PYTHON=$(command -v python3 || true)
  fi
fi
[ -n "$PYTHON" ] || fail "no Python found: set PYTHON=/path/to/python"
[ -x "$PYTHON" ] || command -v "$PYTHON" >/dev/null 2>&1 || fail "PYTHON=$PYTHON is not executable"

# --- MPI -----------------------------------------------------------------------------
want_mpi=1
if [ "${SPARKDIST_HOROVOD_WITHOUT_MPI:-0}" = 1 ] || [ "${HOROVOD_WITHOUT_MPI:-0}" = 1 ]; then
  want_mpi=0
  mpi_tag=nompi
elif command -v mpirun >/dev/null 2>&1 \
  && { command -v mpicxx >/dev/null 2>&1 || command -v mpic++ >/dev/null 2>&1; }; then
  mpi_version_line=$(mpirun --version 2>/dev/null | head -n 1 || true)
  case "$mpi_version_line" in
    *"Open MPI"*) mpi_tag="openmpi${mpi_version_line##* }" ;;
    *) mpi_tag=mpi ;;
  esac
  mpi_tag=$(printf '%s' "$mpi_tag" | tr -c 'A-Za-z0-9._+-' '_')
else
  fail "MPI not found (need mpirun and mpicxx, i.e. openmpi-bin and libopenmpi-dev): run" \
    "init_scripts/install_system.sh first, or set SPARKDIST_HOROVOD_WITHOUT_MPI=1 for a Gloo-only build"
fi

# --- one Python call: versions, paths, and the state of any installed Horovod ----------
# Prints KEY=VALUE lines. HVD_STATUS is ok (usable as is), missing, or stale (reason given).
probe() {
  "$PYTHON" - "$HOROVOD_VERSION" "$want_mpi" <<'EOF'
import json, os, platform, sys, sysconfig, warnings

want_version, want_mpi = sys.argv[1], sys.argv[2] == "1"
print(f"PY_TAG=cp{sys.version_info[0]}{sys.version_info[1]}")
print(f"PY_VERSION={platform.python_version()}")
print(f"MACHINE={platform.machine()}")
print(f"SCRIPTS_DIR={sysconfig.get_path('scripts')}")


def status(state, reason):
    print(f"HVD_STATUS={state}")
    print(f"HVD_REASON={reason}")
    sys.exit(0)


try:
    import torch
except Exception as exc:  # noqa: BLE001
    print(f"TORCH_ERROR={type(exc).__name__}: {exc}".replace("\n", " "))
    sys.exit(0)
print(f"TORCH_VERSION={torch.__version__}")

try:
    import horovod
except ImportError:
    status("missing", "Horovod is not installed")
if horovod.__version__ != want_version:
    status("stale", f"Horovod {horovod.__version__} is installed, not {want_version}")
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import horovod.torch as hvd
except Exception as exc:  # noqa: BLE001
    status("stale", f"horovod.torch does not import: {type(exc).__name__}: {exc}".replace("\n", " "))
try:
    with open(os.path.join(os.path.dirname(horovod.__file__), "metadata.json")) as f:
        built_for = json.load(f).get("pytorch")
except OSError:
    built_for = None
if built_for != torch.__version__:
    status("stale", f"Horovod was built for torch {built_for}, torch {torch.__version__} is installed")
if not hvd.gloo_built():
    status("stale", "installed Horovod was built without Gloo")
if want_mpi and not hvd.mpi_built():
    status("stale", "installed Horovod was built without MPI")
status("ok", f"Horovod {horovod.__version__} for torch {torch.__version__}, "
             f"Gloo{', MPI' if hvd.mpi_built() else ''}")
EOF
}

declare -A info=()
read_probe() {
  local out line
  out=$(probe 2>>"$LOG") || fail "$PYTHON could not run the environment probe (see $LOG)"
  info=()
  while IFS= read -r line; do
    info["${line%%=*}"]="${line#*=}"
  done <<<"$out"
}
read_probe

[ -z "${info[TORCH_ERROR]:-}" ] \
  || fail "torch does not import in $PYTHON's environment (${info[TORCH_ERROR]}): install torch first"
torch_version=${info[TORCH_VERSION]}

if [ "${SPARKDIST_HOROVOD_FORCE_BUILD:-0}" != 1 ] && [ "${info[HVD_STATUS]}" = ok ]; then
  log "already installed and working in $PYTHON: ${info[HVD_REASON]}; nothing to do ($((SECONDS - started))s)"
  exit 0
fi
log "Horovod $HOROVOD_VERSION needed in $PYTHON: ${info[HVD_REASON]}"

# --- cache ---------------------------------------------------------------------------
cache_root=${SPARKDIST_CACHE:-$HOME/.cache/sparkdist}
key="horovod-${HOROVOD_VERSION}_torch-${torch_version}_${info[PY_TAG]}_${mpi_tag}_${info[MACHINE]}"
cache_dir="$cache_root/wheels/$key"
mkdir -p "$cache_dir" || fail "cannot create the cache directory $cache_dir"

# One build at a time per cache (parallel `make` runs, several init scripts on one node).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$cache_root/wheels/.horovod.lock"
  if ! flock -n 9; then
    log "another install_horovod.sh holds $cache_root/wheels/.horovod.lock; waiting for it"
    flock 9
  fi
fi

pip_install() {
  # A stale Horovod (same version, wrong build) is replaced with --force-reinstall --no-deps
  # first; the plain install then adds Horovod and whatever dependencies are missing
  # (cloudpickle, psutil, pyyaml, packaging, cffi) without touching satisfied ones.
  if [ "${info[HVD_STATUS]}" != missing ]; then
    "$PYTHON" -m pip install --no-input --disable-pip-version-check --no-deps --force-reinstall \
      "$1" >>"$LOG" 2>&1 || return 1
  fi
  "$PYTHON" -m pip install --no-input --disable-pip-version-check "$1" >>"$LOG" 2>&1
}

cached_wheel() {
  local whl
  for whl in "$cache_dir"/horovod-"$HOROVOD_VERSION"-*.whl; do
    [ -f "$whl" ] && { echo "$whl"; return 0; }
  done
  return 0
}

wheel=$(cached_wheel)
installed_from=""
if [ -n "$wheel" ] && [ "${SPARKDIST_HOROVOD_FORCE_BUILD:-0}" != 1 ]; then
  log "installing cached wheel $wheel (no rebuild)"
  if pip_install "$wheel"; then
    installed_from=cache
  else
    log "installing the cached wheel failed (see $LOG); removing it and rebuilding"
    rm -f "$wheel"
  fi
fi

# --- build ---------------------------------------------------------------------------
if [ -z "$installed_from" ]; then
  [ "${SPARKDIST_HOROVOD_NO_BUILD:-0}" != 1 ] \
    || fail "no cached Horovod wheel in $cache_dir and SPARKDIST_HOROVOD_NO_BUILD=1"
  command -v cmake >/dev/null 2>&1 || fail "cmake not found: run init_scripts/install_system.sh first"
  command -v g++ >/dev/null 2>&1 || fail "g++ not found: run init_scripts/install_system.sh first"

  work=$(mktemp -d "${TMPDIR:-/tmp}/sparkdist-horovod-build.XXXXXX")
  trap 'rm -rf "$work"' EXIT

  # Build prerequisites: setuptools (backend), and Horovod's setup_requires, which setuptools
  # would otherwise try to fetch itself. Already-satisfied requirements are left untouched.
  log "checking build prerequisites (setuptools, wheel, cffi, cloudpickle, psutil, pyyaml, packaging)"
  "$PYTHON" -m pip install --no-input --disable-pip-version-check \
    setuptools wheel cffi cloudpickle psutil pyyaml packaging >>"$LOG" 2>&1 \
    || fail "pip could not install the build prerequisites into $PYTHON's environment (see $LOG)"

  sdist_dir="$cache_root/sdist"
  sdist="$sdist_dir/horovod-$HOROVOD_VERSION.tar.gz"
  if [ ! -s "$sdist" ]; then
    log "downloading the horovod==$HOROVOD_VERSION sdist from PyPI"
    mkdir -p "$sdist_dir"
    "$PYTHON" -m pip download --no-input --disable-pip-version-check --no-deps \
      --no-binary :all: --no-build-isolation -d "$work/download" "horovod==$HOROVOD_VERSION" \
      >>"$LOG" 2>&1 || fail "pip download horovod==$HOROVOD_VERSION failed (see $LOG)"
    [ -s "$work/download/horovod-$HOROVOD_VERSION.tar.gz" ] \
      || fail "pip download did not produce horovod-$HOROVOD_VERSION.tar.gz (see $LOG)"
    cp "$work/download/horovod-$HOROVOD_VERSION.tar.gz" "$sdist.tmp.$$"
    mv -f "$sdist.tmp.$$" "$sdist"
  fi
  tar -xzf "$sdist" -C "$work" || fail "cannot unpack $sdist (delete it to download again)"
  src="$work/horovod-$HOROVOD_VERSION"

  # torch 2.x needs C++17 (upstream fix merged after 0.28.1, never released).
  for f in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
    grep -q 'set(CMAKE_CXX_STANDARD 14)' "$f" || fail "unexpected sdist: no CMAKE_CXX_STANDARD 14 in $f"
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$f"
    ! grep -q 'set(CMAKE_CXX_STANDARD 14)' "$f" || fail "patching $f to C++17 failed"
  done
  log "patched CMAKE_CXX_STANDARD 14 -> 17 in CMakeLists.txt and horovod/torch/CMakeLists.txt"

  if [ -z "${MAKEFLAGS:-}" ]; then
    # Each compile of a torch-including file takes about 1 GiB; cap jobs by free memory.
    jobs=$(nproc)
    mem_kib=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo 2>/dev/null || true)
    if [ -n "$mem_kib" ]; then
      mem_jobs=$((mem_kib / 1572864))
      [ "$mem_jobs" -ge 1 ] || mem_jobs=1
      [ "$mem_jobs" -ge "$jobs" ] || jobs=$mem_jobs
    fi
    MAKEFLAGS="-j$jobs"
  fi
  export MAKEFLAGS
  build_env=(
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
    HOROVOD_WITH_GLOO=1
  )
  if [ "$want_mpi" = 1 ]; then build_env+=(HOROVOD_WITH_MPI=1); else build_env+=(HOROVOD_WITHOUT_MPI=1); fi

  log "building Horovod $HOROVOD_VERSION from source for torch $torch_version," \
    "Python ${info[PY_VERSION]}, $mpi_tag (${build_env[*]} MAKEFLAGS=$MAKEFLAGS" \
    "HOROVOD_BUILD_ARCH_FLAGS=${HOROVOD_BUILD_ARCH_FLAGS-<auto>}); this takes 10-25 minutes; output in $LOG"
  build_started=$SECONDS
  if ! env "${build_env[@]}" "$PYTHON" -m pip wheel --no-input --disable-pip-version-check -v \
    --no-build-isolation --no-deps -w "$work/wheel" "$src" >>"$LOG" 2>&1; then
    echo "----- last lines of the build output -----" >&2
    tail -n 40 "$LOG" >&2
    fail "building the Horovod wheel failed after $((SECONDS - build_started))s (full output in $LOG)"
  fi
  built=$(find "$work/wheel" -name "horovod-$HOROVOD_VERSION-*.whl" -print -quit)
  [ -n "$built" ] || fail "pip wheel finished but produced no horovod wheel (see $LOG)"
  log "built $(basename "$built") ($(du -h "$built" | cut -f1)) in $((SECONDS - build_started))s"

  wheel="$cache_dir/$(basename "$built")"
  cp "$built" "$wheel.tmp.$$"
  mv -f "$wheel.tmp.$$" "$wheel"
  log "cached the wheel as $wheel"

  log "installing $wheel"
  pip_install "$wheel" || fail "pip install $wheel failed (see $LOG)"
  installed_from=build
fi

# --- verify ----------------------------------------------------------------------------
read_probe
[ "${info[HVD_STATUS]}" = ok ] \
  || fail "Horovod installed from $installed_from does not work: ${info[HVD_REASON]}" \
    "(delete $cache_dir to force a rebuild)"

horovodrun="${info[SCRIPTS_DIR]}/horovodrun"
[ -x "$horovodrun" ] || horovodrun=$(command -v horovodrun || true)
[ -n "$horovodrun" ] || fail "horovodrun not found in ${info[SCRIPTS_DIR]} or on PATH"
# `horovodrun --check-build` probes each extension in ~10 forked processes, each importing
# torch again (12 s of CPU). Running the same horovodrun script with torch already imported
# lets the forks inherit it: identical output in about 3 s.
check=$("$PYTHON" -c 'import runpy, sys, torch  # noqa: F401
sys.argv = [sys.argv[1], "--check-build"]
runpy.run_path(sys.argv[0], run_name="__main__")' "$horovodrun" 2>>"$LOG") \
  || fail "$horovodrun --check-build failed (see $LOG)"
printf '%s\n' "$check" >>"$LOG"
missing=()
grep -Eq '^\s*\[X\] PyTorch' <<<"$check" || missing+=(PyTorch)
grep -Eq '^\s*\[X\] Gloo' <<<"$check" || missing+=(Gloo)
if [ "$want_mpi" = 1 ]; then grep -Eq '^\s*\[X\] MPI' <<<"$check" || missing+=(MPI); fi
[ ${#missing[@]} -eq 0 ] \
  || fail "horovodrun --check-build does not show ${missing[*]} as available (delete $cache_dir to" \
    "force a rebuild):$(printf '\n%s' "$check")"

log "Horovod $HOROVOD_VERSION installed from $installed_from and checked (PyTorch, Gloo$(
  [ "$want_mpi" = 1 ] && echo ", MPI")) in $((SECONDS - started))s"
