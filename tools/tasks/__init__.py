"""Tasks with known answers that the project makes locally: the problems, the response formats a base
model is pre-trained on, and the scoring the reward applies, in one module a task, so that the data maker,
the pre-training and the reward all read the same definition (what the pre-training taught is exactly
what the reward scores)."""
