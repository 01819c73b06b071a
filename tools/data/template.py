"""The R1-Zero prompt: think inside <think></think>, answer inside <answer></answer>, final answer boxed.

`template` names the instruction (TEMPLATES): "r1-zero" is the R1-Zero paper's conversation preamble;
"short" asks for the same format in one sentence (small models and short prompts: the tiny run that
learns, recipes/tiny-learn.yaml). Both ask for the format `tools.reward` scores.

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
SHORT_INSTRUCTION = (
    "Think inside <think> </think>, then answer inside <answer> </answer> with the result in \\boxed{}."
)
TEMPLATES = {"r1-zero": R1_ZERO_INSTRUCTION, "short": SHORT_INSTRUCTION}
STYLES = ("system", "user", "plain")


def instruction(template: str) -> str:
    """The instruction text of a named template (TEMPLATES)."""
    try:
        return TEMPLATES[template]
    except KeyError:
        raise ValueError(f"prompt template {template!r} is not one of {', '.join(TEMPLATES)}") from None


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
