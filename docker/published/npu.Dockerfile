# syntax=docker/dockerfile:1
# ascend-r1 training image of the PUBLISHED stack (CANN 8.2.RC1, torch-npu 2.5.1) for Atlas A3 (default) or A2,
# built from this checkout's pins, locks and patches: CANN and Python come from Ascend's CANN base image;
# everything else is `make bootstrap STACK=published PROFILE=npu` (requirements/published/, locks/published/,
# patches/published/), so the image installs exactly the lock.
#
#   docker build -f docker/published/npu.Dockerfile --build-arg APEX_REF=<commit> -t ascend-r1:published-a3 .
#   docker build -f docker/published/npu.Dockerfile --build-arg APEX_REF=<commit> \
#       --build-arg CANN_IMAGE=quay.io/ascend/cann:8.2.rc1-910b-ubuntu22.04-py3.11 -t ascend-r1:published-a2 .
#
# tests/tools/cluster/test_docker.py lints this file (hadolint) and checks its versions against patches/stacks.toml.
# Not built here: no NPU, and the build needs git access for MindSpeed and Ascend apex.
ARG CANN_IMAGE=quay.io/ascend/cann:8.2.rc1-a3-ubuntu22.04-py3.11
FROM ${CANN_IMAGE}

# Ascend apex has no PyPI release (the PyPI "apex" is another project): built from gitcode at APEX_REF.
ARG APEX_REF=""
ARG APEX_URL=https://gitcode.com/Ascend/apex.git

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends git make patch ca-certificates libjemalloc2 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /workspace/ascend-r1
COPY . .

# the environment, the pristine upstream trees and the patch series, exactly as on a bare-metal node
RUN source /usr/local/Ascend/ascend-toolkit/set_env.sh \
    && make bootstrap STACK=published PROFILE=npu

WORKDIR /workspace
RUN test -n "${APEX_REF}" || { echo "--build-arg APEX_REF=<commit of ${APEX_URL}> is required"; exit 1; } \
    && git clone "${APEX_URL}" apex \
    && git -C apex checkout --detach "${APEX_REF}"
WORKDIR /workspace/apex
RUN source /usr/local/Ascend/ascend-toolkit/set_env.sh \
    && bash scripts/build.sh --python=3.11 \
    && /workspace/ascend-r1/.venv-published-npu/bin/python -m pip install --no-deps --no-cache-dir apex/dist/apex-*.whl \
    && rm -rf /workspace/apex/*

WORKDIR /workspace/ascend-r1
ENV ASCEND_R1_STACK=published PATH=/workspace/ascend-r1/.venv-published-npu/bin:${PATH}
# the recipes export their own environment (launch.env) for every run; nothing run-specific is baked in
CMD ["make", "help"]
