"""`make eval`: a checkpoint or Hugging Face model scored by DeepSeek-R1's own measure (docs/evaluation.md).

passk.py     pass@k (Chen et al. 2021's unbiased estimator) and the k's a summary reports
consensus.py cons@k: the majority vote over extracted answers
summary.py   responses -> summary.json (pass@1 and its standard error, cons@k, pass@k, lengths, truncation)
problems.py  what is sampled: a shipped benchmark (tools/data/benchmarks.py) or a run's held-out set
grading.py   the recipe's own reward function, the grader training used
engine.py    sampling with the stack's vLLM engine (vLLM's CPU build here, vllm-ascend on an NPU node)
folder.py    the eval folder: responses.jsonl written a problem batch at a time, resumable
cli.py       the command line (`python -m tools.eval`)
compare.py   sharpening or discovery: two models' pass@k curves on the same problems
"""
