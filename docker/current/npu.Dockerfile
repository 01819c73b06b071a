# syntax=docker/dockerfile:1
# ascend-r1 training image of the CURRENT stack (CANN 9.1.0, torch-npu 2.10.0.post4, vLLM/vllm-ascend 0.23,
# verl 0.9.1, megatron-core 0.16.1) for Atlas A3 (default) or A2, built from this checkout's pins, locks and
# patches: CANN and Python come from Ascend's CANN base image; everything else is
# `make bootstrap STACK=current PROFILE=npu` (requirements/current/, locks/current/, patches/current/), so the
# image installs exactly the lock, plus triton-ascend, which only Ascend's index serves.
#
#   docker build -f docker/current/npu.Dockerfile --build-arg APEX_REF=<commit> -t ascend-r1:current-a3 .
#   docker build -f docker/current/npu.Dockerfile --build-arg APEX_REF=<commit> --build-arg SOC_VERSION=ascend910b1 \
#       --build-arg CANN_IMAGE=quay.io/ascend/cann:9.1.0-910b-ubuntu22.04-py3.11 -t ascend-r1:current-a2 .
#
# SOC_VERSION is what vllm-ascend's build compiles its kernels for when it cannot detect the chip (A3:
# ascend910_9391 as in vllm-ascend's own Dockerfile.a3; verl's uses ascend910_9392; A2: ascend910b1).
# tests/tools/cluster/test_docker.py lints this file (hadolint) and checks its versions against patches/stacks.toml.
# Not built here: no NPU, the CANN 9.1.0 py3.11 tag was not checked against the registry (verl's and
# vllm-ascend's images use py3.12), and the build needs git access for MindSpeed and Ascend apex.
ARG CANN_IMAGE=quay.io/ascend/cann:9.1.0-a3-ubuntu22.04-py3.11
FROM ${CANN_IMAGE}

# Ascend apex has no PyPI release (the PyPI "apex" is another project): built from gitcode at APEX_REF.
ARG APEX_REF=""
ARG APEX_URL=https://gitcode.com/Ascend/apex.git
ARG SOC_VERSION=ascend910_9391
ARG ASCEND_INDEX=https://mirrors.huaweicloud.com/ascend/repos/pypi

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends git make patch ca-certificates libjemalloc2 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /workspace/ascend-r1
COPY . .

# the environment, the pristine upstream trees and the patch series, exactly as on a bare-metal node
RUN source /usr/local/Ascend/ascend-toolkit/set_env.sh \
    && SOC_VERSION=${SOC_VERSION} make bootstrap STACK=current PROFILE=npu \
    && .venv-current-npu/bin/python -m pip install --no-deps --no-cache-dir triton-ascend==3.2.2 \
        --extra-index-url "${ASCEND_INDEX}"

WORKDIR /workspace
RUN test -n "${APEX_REF}" || { echo "--build-arg APEX_REF=<commit of ${APEX_URL}> is required"; exit 1; } \
    && git clone "${APEX_URL}" apex \
    && git -C apex checkout --detach "${APEX_REF}"
WORKDIR /workspace/apex
RUN source /usr/local/Ascend/ascend-toolkit/set_env.sh \
    && bash scripts/build.sh --python=3.11 \
    && /workspace/ascend-r1/.venv-current-npu/bin/python -m pip install --no-deps --no-cache-dir apex/dist/apex-*.whl \
    && rm -rf /workspace/apex/*

WORKDIR /workspace/ascend-r1
ENV ASCEND_R1_STACK=current PATH=/workspace/ascend-r1/.venv-current-npu/bin:${PATH}
# the recipes export their own environment (launch.env) for every run; nothing run-specific is baked in
CMD ["make", "help"]
