"""The R1-Zero prompt: think inside <think></think>, answer inside <answer></answer>, final answer boxed.

`style` decides where the instruction goes:
- "system": a system message with the instruction, then the problem as the user message;
- "user":   one user message, the instruction as a prefix of the problem (for chat templates that
            drop or mangle system messages);
- "plain":  the problem alone (for SFT-style data or a template of your own).
"""

from __future__ import annotations

R1_ZERO_INSTRUCTION = (
    "A conversation between User and Assistant. The User asks a question and the Assistant solves it. "
    "The Assistant first thinks through the reasoning privately and then gives the User the answer. "
    "The reasoning goes inside <think> </think> tags and the answer inside <answer> </answer> tags, "
    "i.e. <think> reasoning here </think> <answer> answer here </answer>. "
    "Inside the answer, put the final result in \\boxed{}."
)
STYLES = ("system", "user", "plain")


def build_prompt(
    problem: str, style: str = "system", instruction: str = R1_ZERO_INSTRUCTION
) -> list[dict[str, str]]:
    """The chat message list verl stores in the `prompt` column."""
    if style == "system":
        return [{"role": "system", "content": instruction}, {"role": "user", "content": problem}]
    if style == "user":
        return [{"role": "user", "content": f"{instruction}\n\n{problem}"}]
    if style == "plain":
        return [{"role": "user", "content": problem}]
    raise ValueError(f"prompt style {style!r} is not one of {', '.join(STYLES)}")
