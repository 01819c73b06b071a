"""Rule rewards for math RL: answer extraction, graders, a timed worker pool and verl entry points.

verl loads `tools/reward/verl_reward.py` by path (`custom_reward_function.path`); everything else is a
normal package module.
"""
