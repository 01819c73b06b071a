"""What one validation costs, so that trainer.test_freq is chosen knowingly.

verl validates before training (trainer.val_before_train) and every trainer.test_freq steps: each of the
validation set's problems is sampled actor_rollout_ref.rollout.val_kwargs.n times, up to
data.max_response_length tokens (validation has no limit of its own), and graded. The cost:

    generated tokens = problems x n x expected response length (and at most problems x n x the cap)
    seconds          = the planner's generation model (tools/plan/timing.py, the step's own
                       factors) run on problems x n sequences instead of the training batch

The expected response length is the training expectation (launch.expect or half the cap): validation
samples at a lower temperature on harder problems, so take it as a guide, not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from tools.data.benchmarks import BENCHMARKS
from tools.plan import timing as T
from tools.plan.factors import Factors
from tools.plan.lengths import Lengths
from tools.plan.runsetup import data_prompt_tokens


@dataclass(frozen=True)
class ValidationCost:
    files: str  # the validation files' names
    problems: int
    problems_how: str
    samples: int
    temperature: float | None
    top_p: float | None
    cap: int
    response: float  # expected mean response, tokens
    seconds: float  # predicted generation time of one validation
    test_freq: int | None  # steps between validations (None: only before training / never)

    @property
    def responses(self) -> int:
        return self.problems * self.samples

    @property
    def tokens(self) -> float:
        return self.responses * self.response

    @property
    def tokens_at_cap(self) -> int:
        return self.responses * self.cap

    def json(self, step_s: float | None = None) -> dict[str, Any]:
        out = {
            "problems": self.problems,
            "samples": self.samples,
            "responses": self.responses,
            "generated_tokens": round(self.tokens),
            "generated_tokens_at_cap": self.tokens_at_cap,
            "seconds": round(self.seconds, 3),
            "test_freq": self.test_freq,
        }
        if step_s and self.test_freq:
            out["seconds_per_step"] = round(self.seconds / self.test_freq, 3)
        return out

    def lines(self, step_s: float | None = None) -> list[str]:
        sampling = ", ".join(
            x
            for x in (
                f"T={self.temperature:g}" if self.temperature is not None else "",
                f"top-p {self.top_p:g}" if self.top_p is not None else "",
            )
            if x
        )
        out = [
            f"validation ({self.files}: {self.problems} problems {self.problems_how} x {self.samples} samples"
            + (f" at {sampling}" if sampling else "")
            + f", cut at {self.cap}): {self.responses} responses, {self.tokens:,.0f} generated tokens "
            f"expected (mean {self.response:.0f}), {self.tokens_at_cap:,} at the cap; predicted "
            f"{self.seconds:.1f} s of generation (the step's generation model)"
        ]
        if self.test_freq and step_s:
            per = self.seconds / self.test_freq
            out.append(
                f"  every trainer.test_freq={self.test_freq} steps: +{per:.1f} s a step on average "
                f"({per / step_s:.1%} of the {step_s:.1f} s step), plus once before training"
            )
        elif not self.test_freq:
            out.append("  trainer.test_freq <= 0: validation only before training (val_before_train)")
        return out


def _files(value: Any) -> list[str]:
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value)
    items = value if isinstance(value, list | tuple) else [value]
    return [str(f) for f in items if f]


def count_problems(files: list[str]) -> tuple[int | None, str]:
    """Rows of the validation files: a shipped benchmark's count by its name (no file read), else the
    parquet's row count; None when a file is not there yet."""
    total, how = 0, set()
    for f in files:
        name = Path(f).stem
        if name in BENCHMARKS:
            total += BENCHMARKS[name].count
            how.add("(shipped benchmark)")
            continue
        if not Path(f).is_file():
            return None, f"({f} not made yet)"
        from tools.data.parquet import ParquetError, open_parquet  # pyarrow: only for a file to count

        try:
            total += open_parquet(f).metadata.num_rows
        except ParquetError:
            return None, f"({f} unreadable)"
        how.add("(rows of the file)")
    return total, " ".join(sorted(how))


def estimate(cfg: DictConfig, setup: T.Setup, factors: Factors) -> ValidationCost | None:
    """One validation's cost for a composed recipe (cfg.verl) and the step's setup and factors; None when
    the recipe names no validation file or its size is not known yet."""
    v = cfg.verl
    files = _files(OmegaConf.select(v, "data.val_files"))
    if not files:
        return None
    problems, how = count_problems(files)
    if not problems:
        return None
    vk = OmegaConf.select(v, "actor_rollout_ref.rollout.val_kwargs") or {}
    samples = int(vk.get("n", 1) or 1) if vk.get("do_sample", True) else 1
    freq = OmegaConf.select(v, "trainer.test_freq")
    freq = int(freq) if freq is not None and int(freq) > 0 else None
    ln = setup.lengths
    prompt = data_prompt_tokens(files) or ln.prompt
    lengths = Lengths.of(prompt, ln.response, ln.response_max, ln.clip)
    val_setup = setup.with_(prompts=problems, samples=samples, lengths=lengths)
    seconds = T.step(val_setup, factors).phases["generate"].seconds
    temperature, top_p = vk.get("temperature"), vk.get("top_p")
    return ValidationCost(
        files=", ".join(Path(f).name for f in files),
        problems=problems,
        problems_how=how,
        samples=samples,
        temperature=float(temperature) if temperature is not None else None,
        top_p=float(top_p) if top_p is not None else None,
        cap=ln.response_max,
        response=ln.response,
        seconds=seconds,
        test_freq=freq,
    )
