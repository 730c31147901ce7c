#!/usr/bin/env bash
# End to end: vLLM on CPU with kvpool behind it, both ways (kvpool's own offloading tier,
# and LMCache's multiprocess server with kvpool as its L2), on a tiny random Llama made here.
# Each way: a prompt, a restart of every cache, the prompt again; checks that the engine
# reports the prompt's blocks cached, that kvpool served them, and that the output equals the
# uncached run's (tests/vllm/e2e/e2e_vllm.py says what exactly). Prints E2E OK at the end.
#
#   scripts/e2e_vllm.sh [--ways tier,lmcache] [--work DIR]
#
# Needs .venv (kvpool with LMCache, scripts/install_lmcache.sh) and .venv-vllm (vLLM,
# scripts/install_vllm.sh, run here: fast when installed). The model and logs go to --work
# (default: a new temporary folder, kept, printed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_vllm.sh >/dev/null
[ -x .venv/bin/lmcache ] || bash scripts/install_lmcache.sh >/dev/null
WORK=""
ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --work) WORK="$2"; shift 2 ;;
        *) ARGS+=("$1"); shift ;;
    esac
done
WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/kvpool-e2e-vllm.XXXXXX")}
echo "e2e work folder (model, logs): $WORK"
# vLLM's engines make ZeroMQ sockets under VLLM_RPC_BASE_PATH (default /tmp) and leave them
# there; a folder of their own, removed at the end. It stays short: socket paths hold 107
# bytes, and a pytest work folder is long.
IPC=$(mktemp -d /tmp/kvpool-vllm-ipc.XXXXXX)
trap 'rm -rf "$IPC"' EXIT
VLLM_RPC_BASE_PATH=$IPC .venv-vllm/bin/python tests/vllm/e2e/e2e_vllm.py --work "$WORK" "${ARGS[@]}"
