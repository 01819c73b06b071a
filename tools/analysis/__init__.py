"""Analyses of a run: did it learn (learning: held-out accuracy against the base model), and how it
reasons (reasoning: response length, trace use). They read runs and models; they make none."""
