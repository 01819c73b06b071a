"""The miniature: the tiny models, tokenizers, data and checkpoints that let `make train` run a recipe on a
CPU (assets), and the base models pre-trained for the tasks of tools/tasks."""
