#!/usr/bin/env bash
# Installs what sparkdist needs from the operating system on a Debian/Ubuntu node:
# Java 17 (only when no java is on PATH), Open MPI, and the tools the tests use (headless
# Chromium: tests/trace/test_trace_browser.py opens a job's timeline page in it).
# Idempotent: it installs only what is missing. Usable as a Databricks cluster init script.
set -euo pipefail

LOG=${SPARKDIST_INIT_LOG:-/tmp/sparkdist-init.log}
log() { echo "[sparkdist install_system] $*" | tee -a "$LOG" >&2; }
fail() { log "FAILED: $*"; exit 1; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || fail "not root and no sudo: run as root or install: $*"
  SUDO="sudo"
fi

missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
[ -e /usr/include/x86_64-linux-gnu/mpi/mpi.h ] || [ -e /usr/include/mpi.h ] \
  || dpkg -s libopenmpi-dev >/dev/null 2>&1 || missing+=(libopenmpi-dev)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
# Chromium only for the tests (the timeline in a real browser): not on a Databricks node.
[ -n "${DATABRICKS_RUNTIME_VERSION:-}" ] || command -v chromium >/dev/null 2>&1 \
  || missing+=(chromium)

if [ ${#missing[@]} -eq 0 ]; then
  log "system packages present"
  exit 0
fi

log "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >>"$LOG" 2>&1 || fail "apt-get update (see $LOG)"
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$LOG" 2>&1 \
  || fail "apt-get install ${missing[*]} (see $LOG)"
log "installed: ${missing[*]}"
