#!/usr/bin/env bash
# Registers and local-memory spills of every hand-written CUDA kernel for
# sm_80 and sm_90, as ptxas reports them through NVRTC (no GPU needed; run
# .ci/setup first for NVRTC). The test fails if any kernel spills.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec cargo test -p kiln-tests --test cuda_nvrtc hand_written -- --nocapture
