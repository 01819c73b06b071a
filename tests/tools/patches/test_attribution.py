"""`make lint`: a file that a patch CREATES carries the project's attribution, never an upstream company's."""

from __future__ import annotations

import dataclasses

import pytest

from tests.tools.patches.gitfixtures import make_project
from tools.patches import manager
from tools.patches.series import lint, read_series

APACHE = (
    '#\n# Licensed under the Apache License, Version 2.0 (the "License");\n'
    "# you may not use this file except in compliance with the License.\n"
)
OURS = "# Copyright 2026 The ascend-r1 Authors\n" + APACHE
SPDX = (
    "# SPDX-License-Identifier: Apache-2.0\n"
    "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n"
)


def _created(tmp_path, header: str, name: str = "newmod.py"):
    """A demo project whose one patch creates `name` with `header` on top; returns (upstream, problems)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    p = make_project(tmp_path)
    p.commit_in_tree(name, header + "\nVALUE = 1\n", subject="demo: core: add a module")
    up = p.upstream()
    manager.export(up)
    return p, up, "\n".join(lint(up, {"demo": read_series(up)}))


@pytest.mark.parametrize(
    "line",
    [
        "# Copyright 2025 Bytedance Ltd. and/or its affiliates",
        "# Copyright (c) 2025, NVIDIA CORPORATION. All rights reserved.",
        "# Copyright (c) 2025 Huawei Technologies Co., Ltd. All Rights Reserved.",
        "# Copyright 2025 the vLLM Team",
    ],
)
def test_a_created_file_with_an_upstream_company_copyright_fails(tmp_path, line):
    _, _, problems = _created(tmp_path, line + "\n" + APACHE)
    assert f"creates newmod.py with an upstream company's copyright '{line}'" in problems
    assert "# Copyright 2026 The ascend-r1 Authors" in problems  # the message says what to write


def test_the_projects_attribution_passes_and_its_absence_fails(tmp_path):
    _, _, problems = _created(tmp_path / "ours", OURS)
    assert problems == ""
    _, _, problems = _created(tmp_path / "bare", "")
    assert "creates newmod.py without the project's attribution" in problems
    assert "creates newmod.py without the Apache-2.0 notice" in problems
    _, _, problems = _created(tmp_path / "no-license", "# Copyright 2026 The ascend-r1 Authors\n")
    assert "without the Apache-2.0 notice" in problems and "without the project's attribution" not in problems


def test_only_created_source_files_are_checked(tmp_path):
    # editing an upstream file that carries the upstream's own line is fine; so is a data file
    p = make_project(tmp_path)
    p.commit_in_tree("hello.py", "# Copyright (c) 2024, NVIDIA CORPORATION.\ndef greet():\n    return 'hi'\n")
    p.commit_in_tree("notes.txt", "Copyright 2025 Bytedance Ltd.\n", subject="demo: docs: add notes")
    up = p.upstream()
    manager.export(up)
    assert lint(up, {"demo": read_series(up)}) == []


def test_vllm_files_also_need_both_spdx_lines(tmp_path):
    _, up, _ = _created(tmp_path, OURS)
    vllm = dataclasses.replace(up, url="https://github.com/vllm-project/vllm.git")
    problems = "\n".join(lint(vllm, {"demo": read_series(up)}))
    assert "without '# SPDX-License-Identifier: Apache-2.0' (vLLM's check_spdx_header)" in problems
    _, up2, _ = _created(tmp_path / "spdx", SPDX + "# Copyright 2026 The ascend-r1 Authors\n")
    vllm2 = dataclasses.replace(up2, url="https://github.com/vllm-project/vllm.git")
    assert lint(vllm2, {"demo": read_series(up2)}) == []
