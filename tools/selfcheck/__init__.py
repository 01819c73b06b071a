"""`make selfcheck`: the on-hardware proof kit for the NPU patch series (docs/design.md §1-6).

Each check has a CPU form (tiny modules, gloo, vLLM's own code from the patched tree) and an NPU form
(a real vLLM engine on one node, hccl). `python -m tools.selfcheck` prints a table (check, result,
figure) and exits non-zero when any check fails.
"""
