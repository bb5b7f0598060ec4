#!/usr/bin/env bash
# Cluster init script for sparkdist: Databricks (every node, before Spark starts) or any
# Debian/Ubuntu Spark node. In order, each step idempotent (it does only what is missing):
#   1. system packages: Open MPI, cmake, g++ ...          (install_system.sh, beside this file)
#   2. Horovod built against the installed torch          (install_horovod.sh, cached wheel)
#   3. sparkdist itself into $PYTHON's environment
#   4. optionally this checkout's conf/ to $SPARKDIST_CONF_DEST (e.g. the GPU discovery script)
#   5. `sparkdist doctor`: the node fails to start, with the reason, if anything is missing.
# Everything is logged to $SPARKDIST_INIT_LOG; a failure names the step and the log.
#
# Environment:
#   PYTHON                 interpreter to install into (default /databricks/python/bin/python
#                          if present, else python3)
#   SPARKDIST_HOME         the sparkdist checkout (default: the one this script is in). Set it
#                          when the platform runs a copy of this script (Databricks runs
#                          workspace-file init scripts from a copy): e.g. the Git folder
#                          /Workspace/Shared/sparkdist
#   SPARKDIST_PACKAGE      what to install: a source directory, a wheel file, or a pip
#                          requirement (default: $SPARKDIST_HOME)
#   SPARKDIST_SKIP_HOROVOD=1  no Horovod (clusters that only use DDP, TensorFlow or ensembles)
#   SPARKDIST_CONF_DEST    copy conf/ of the checkout there (default: do not copy)
#   SPARKDIST_INIT_LOG     log file (default /tmp/sparkdist-init.log)
#   plus the variables of install_horovod.sh (SPARKDIST_CACHE, SPARKDIST_HOROVOD_NO_BUILD ...)
set -euo pipefail

LOG=${SPARKDIST_INIT_LOG:-/tmp/sparkdist-init.log}
export SPARKDIST_INIT_LOG=$LOG
mkdir -p "$(dirname "$LOG")"
step="start"
log() { echo "[sparkdist init] $*" | tee -a "$LOG" >&2; }
fail() { log "FAILED at step '$step': $*"; exit 1; }
trap 'fail "unexpected error (exit $?) at line $LINENO: $BASH_COMMAND (see $LOG)"' ERR

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -n "${SPARKDIST_HOME:-}" ]; then
  home=$SPARKDIST_HOME
elif [ -f "$here/install_system.sh" ]; then
  home=$(cd "$here/.." && pwd)
else
  fail "the other init scripts are not beside this copy ($here): set SPARKDIST_HOME to the" \
    "sparkdist checkout (e.g. the Git folder /Workspace/Shared/sparkdist)"
fi
scripts=$home/init_scripts
for script in install_system.sh install_horovod.sh; do
  [ -f "$scripts/$script" ] || fail "$scripts/$script not found: is SPARKDIST_HOME=$home a sparkdist checkout?"
done
started=$SECONDS
log "starting on $(hostname) ($(date -u +%Y-%m-%dT%H:%M:%SZ)); log in $LOG"

if [ -z "${PYTHON:-}" ]; then
  if [ -x /databricks/python/bin/python ]; then
    PYTHON=/databricks/python/bin/python
  else
    PYTHON=$(command -v python3 || true)
  fi
fi
if [ -z "$PYTHON" ] || ! "$PYTHON" -c 'import sys' 2>/dev/null; then
  fail "no working Python: set PYTHON=/path/to/python (got '${PYTHON:-}')"
fi
export PYTHON
# The environment's scripts (sparkdist, horovodrun) come first on PATH.
PATH="$(dirname "$PYTHON"):$PATH"
export PATH

# --- 1. system packages ------------------------------------------------------------------
step="system packages"
bash "$scripts/install_system.sh" || fail "install_system.sh failed (see $LOG)"

# --- 2. Horovod --------------------------------------------------------------------------
step="horovod"
if [ "${SPARKDIST_SKIP_HOROVOD:-0}" = 1 ]; then
  log "SPARKDIST_SKIP_HOROVOD=1: not installing Horovod"
else
  bash "$scripts/install_horovod.sh" || fail "install_horovod.sh failed (see $LOG)"
fi

# --- 3. sparkdist --------------------------------------------------------------------------
step="sparkdist"
package=${SPARKDIST_PACKAGE:-}
if [ -z "$package" ]; then
  [ -f "$home/setup.py" ] \
    || fail "no SPARKDIST_PACKAGE given and $home has no setup.py: set SPARKDIST_PACKAGE to" \
      "a wheel (e.g. /Volumes/main/default/libs/sparkdist-0.1.0-py3-none-any.whl)," \
      "a source directory, or a pip requirement"
  package=$home
fi

# The version this package would install ("" for a plain pip requirement: pip decides).
wanted=""
if [ -d "$package" ]; then
  [ -f "$package/setup.py" ] || fail "SPARKDIST_PACKAGE=$package is a directory without setup.py"
  wanted=$(sed -n 's/^ *version="\([^"]*\)".*/\1/p' "$package/setup.py" | head -n 1)
elif [[ "$package" == *.whl ]]; then
  [ -f "$package" ] || fail "SPARKDIST_PACKAGE=$package: no such wheel file"
  wanted=$(basename "$package" | cut -d- -f2)
fi
installed=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("sparkdist"))' 2>/dev/null || true)

if [ -n "$wanted" ] && [ "$installed" = "$wanted" ] && "$PYTHON" -c 'import sparkdist' 2>/dev/null; then
  log "sparkdist $installed already installed in $PYTHON; nothing to do"
else
  # A Spark runtime that provides pyspark (Databricks) must keep its own: install without
  # dependencies, then add the ones that are missing.
  pip=("$PYTHON" -m pip install --no-input --disable-pip-version-check)
  deps=()
  if [ -n "${DATABRICKS_RUNTIME_VERSION:-}" ] || "$PYTHON" -c 'import pyspark' 2>/dev/null; then
    deps=(--no-deps)
  fi
  source=$package
  if [ -d "$package" ]; then
    # Build from a copy: the checkout may be read-only (a Databricks workspace folder).
    copy=$(mktemp -d "${TMPDIR:-/tmp}/sparkdist-src.XXXXXX")
    trap 'rm -rf "$copy"' EXIT
    tar -C "$package" --exclude=./.git --exclude='./.venv*' --exclude=./build \
      --exclude='*.egg-info' --exclude=__pycache__ -cf - . | tar -C "$copy" -xf -
    source=$copy
  fi
  log "installing sparkdist ${wanted:-($package)} into $PYTHON${deps[*]:+ (pyspark is provided: ${deps[*]})}"
  "${pip[@]}" "${deps[@]}" "$source" >>"$LOG" 2>&1 || fail "pip install $package failed (see $LOG)"
  if [ ${#deps[@]} -gt 0 ]; then
    missing=$("$PYTHON" - <<'PY'
import importlib.util
wanted = {"cloudpickle": "cloudpickle>=2.2", "numpy": "numpy>=1.24", "pandas": "pandas>=2.2",
          "pyarrow": "pyarrow>=18", "psutil": "psutil>=5.9"}
print(" ".join(req for mod, req in wanted.items() if importlib.util.find_spec(mod) is None))
PY
)
    if [ -n "$missing" ]; then
      log "installing missing dependencies: $missing"
      # shellcheck disable=SC2086 # one word per requirement
      "${pip[@]}" $missing >>"$LOG" 2>&1 || fail "pip install $missing failed (see $LOG)"
    fi
  fi
  log "installed sparkdist $("$PYTHON" -c 'import importlib.metadata as m; print(m.version("sparkdist"))')"
fi

# --- 4. configuration files -----------------------------------------------------------------
step="configuration"
if [ -n "${SPARKDIST_CONF_DEST:-}" ]; then
  [ -d "$home/conf" ] || fail "SPARKDIST_CONF_DEST is set but $home/conf does not exist"
  mkdir -p "$SPARKDIST_CONF_DEST" || fail "cannot create $SPARKDIST_CONF_DEST"
  cp "$home"/conf/* "$SPARKDIST_CONF_DEST"/
  chmod +x "$SPARKDIST_CONF_DEST"/*.sh
  log "copied conf/ to $SPARKDIST_CONF_DEST"
fi

# --- 5. check -------------------------------------------------------------------------------
step="sparkdist doctor"
# Databricks' pyspark lives outside site-packages, and init scripts run before Spark starts.
if [ -d /databricks/spark/python ]; then
  export PYTHONPATH="/databricks/spark/python${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! report=$("$PYTHON" -m sparkdist doctor 2>&1); then
  printf '%s\n' "$report" >>"$LOG"
  fail "sparkdist doctor reports missing pieces:$(printf '\n%s' "$report")"
fi
printf '%s\n' "$report" | tee -a "$LOG" >&2
if [ "${SPARKDIST_SKIP_HOROVOD:-0}" != 1 ] && ! grep -Eq '^Horovod +ok' <<<"$report"; then
  fail "Horovod was installed but sparkdist doctor does not see it:$(printf '\n%s' "$report")"
fi
log "sparkdist is ready on $(hostname) ($((SECONDS - started))s)"
