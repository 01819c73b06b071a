"""What the rule groups share: the Result record, the collector they add to, and typed readers of the
recipe's values that turn a bad value (a string, a float, 0, a negative, null) into one FAIL naming the
key and its allowed range instead of an exception."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tools.plan import memory as M

PASS, WARN, FAIL, SKIP, INFO = "PASS", "WARN", "FAIL", "SKIP", "INFO"
NOT_DIVISIBLE = "not-divisible:"  # tools/recipes/recipe.py _int_div's marker for an inexact ${int_div:a,b}


@dataclass
class Result:
    group: str
    rule: str
    status: str
    values: str
    message: str = ""  # what it means; for WARN/FAIL: what to do

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    def as_json(self) -> dict[str, str]:
        """The JSON output's record (`rules` in docs/launch.md)."""
        return {
            "status": self.status,
            "name": self.rule,
            "group": self.group,
            "values": self.values,
            "message": self.message,
        }


@dataclass
class Context:
    """The composed recipe, the facts one rule group hands the next (world, layout, lengths), and the
    results so far. Rule modules read from it and add to it; none raises on a bad value."""

    cfg: DictConfig
    check_machine: bool
    results: list[Result] = field(default_factory=list)
    verl_full: DictConfig | None = None
    arch: M.Arch | None = None
    world: int | None = None
    layout: M.Layout | None = None  # None: the actor layout is invalid (its rules FAIL)
    rollout_tp: int | None = None
    rollout_ep: int = 1
    prompt: int | None = None  # data.max_prompt_length
    response: int | None = None  # data.max_response_length
    seq: int | None = None  # prompt + response
    max_model_len: int | None = None
    estimate: M.Estimate | None = None

    @property
    def launch(self) -> DictConfig:
        return self.cfg.launch

    # ---- results ----
    def add(
        self,
        group: str,
        rule: str,
        ok: bool | None,
        values: str,
        fix: str = "",
        *,
        warn: bool = False,
        info: str = "",
    ) -> Result:
        if ok is None:
            status = SKIP
        elif ok:
            status = PASS
        else:
            status = WARN if warn else FAIL
        res = Result(group, rule, status, values, info if ok else fix)
        self.results.append(res)
        return res

    def note(self, group: str, rule: str, values: str, message: str = "") -> None:
        self.results.append(Result(group, rule, INFO, values, message))

    def skip(self, group: str, rule: str, why: str) -> None:
        self.results.append(Result(group, rule, SKIP, "-", why))

    def failed(self, group: str) -> list[str]:
        return [r.rule for r in self.results if r.group == group and r.status == FAIL]

    # ---- values ----
    def get(self, key: str, default: Any = None) -> Any:
        """A verl key of the composed config (verl's defaults filled in); an interpolation that cannot
        resolve reads as the error's text, which the typed readers below refuse."""
        try:
            value = OmegaConf.select(self.verl_full, key, default=default)
            return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        except (OmegaConfBaseException, ValueError, TypeError, ZeroDivisionError) as e:
            return f"<cannot resolve: {str(e).splitlines()[0]}>"

    def launch_get(self, key: str, default: Any = None) -> Any:
        try:
            return OmegaConf.select(self.cfg, "launch." + key, default=default)
        except (OmegaConfBaseException, ValueError, TypeError, ZeroDivisionError) as e:
            return f"<cannot resolve: {str(e).splitlines()[0]}>"

    def integer(
        self,
        group: str,
        key: str,
        *,
        low: int = 1,
        default: Any = None,
        if_null: Any = None,
        launch: bool = False,
        why: str = "",
    ) -> int | None:
        """The integer value of a verl key (`launch.<key>` with launch=True), or None after one FAIL that
        names the key and the allowed range. if_null: what null (or a missing key) stands for when it is
        allowed (an int); left None, null is refused too."""
        raw = self.launch_get(key, default) if launch else self.get(key, default)
        if raw is None and if_null is not None:
            return if_null
        value = check_integer(raw, low=low)
        if value is not BAD:
            return value
        name = f"launch.{key}" if launch else f"verl.{key}"
        self.add(
            group,
            f"{name} is a whole number >= {low}",
            False,
            f"{name}={raw!r}",
            fix_text(name, raw, low, why),
        )
        return None

    def fraction(self, group: str, key: str, *, launch: bool = False, high: float = 1.0) -> float | None:
        """A number in (0, high]: gpu_memory_utilization, device memory."""
        raw = self.launch_get(key) if launch else self.get(key)
        ok = isinstance(raw, int | float) and not isinstance(raw, bool) and 0 < raw <= high
        if ok:
            return float(raw)
        name = f"launch.{key}" if launch else f"verl.{key}"
        upper = f"at most {high:g}" if high != float("inf") else "no upper bound"
        self.add(
            group,
            f"{name} is a number > 0",
            False,
            f"{name}={raw!r}",
            f"set {name} to a number > 0 ({upper})",
        )
        return None


BAD = object()


def check_integer(raw: Any, *, low: int) -> Any:
    """raw as an int >= low, or BAD."""
    if raw is None or isinstance(raw, bool):
        return BAD
    if isinstance(raw, float) and raw.is_integer():
        raw = int(raw)
    if isinstance(raw, str) and raw.strip().lstrip("+").isdigit():
        raw = int(raw)
    if not isinstance(raw, int) or raw < low:
        return BAD
    return raw


def fix_text(name: str, raw: Any, low: int, why: str) -> str:
    if isinstance(raw, str) and raw.startswith(NOT_DIVISIBLE):
        a, _, b = raw[len(NOT_DIVISIBLE) :].partition("/")
        return (
            f"{name} is derived as {a} / {b}, which is not a whole number: choose sizes that divide "
            f"(for a rollout: a tensor_model_parallel_size that divides the world {a})"
        )
    kind = "null" if raw is None else type(raw).__name__
    return f"set {name} to a whole number >= {low} (got {kind} {raw!r})" + (f"; {why}" if why else "")
