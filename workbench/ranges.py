"""Declared ranges for numbers, lists of numbers and choices: one check for a command's options
and for the library functions behind them, so a value is refused before anything runs, in one
line naming the parameter, the value and what is accepted.

A float must be finite (``nan`` passes every ``<`` comparison, so a range check alone lets it
through); an int is an int (``1e9`` is accepted only where it is a whole number in range, ``2.5``
never); a bool is not a number. On the command line, :meth:`Spec.parser` is an option's parser.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from workbench.errors import ConfigError

__all__ = ["Num", "Ints", "Choice", "Spec", "check_all"]


class Spec:
    """A declared parameter: ``check(value, name)`` returns the value, typed, or raises a
    one-line :class:`ConfigError`."""

    def check(self, value: Any, name: str) -> Any:
        raise NotImplementedError

    def accepted(self) -> str:
        raise NotImplementedError

    def refuse(self, value: Any, name: str, why: str = "") -> ConfigError:
        shown = value if isinstance(value, str) and value.isprintable() and value else \
            ascii(value)  # a control character would break the one line
        shown = shown if len(shown) <= 40 else shown[:36] + "..."
        return ConfigError(f"{name} {shown}", why or self.unlike(), f"pass {self.accepted()}")

    def unlike(self) -> str:
        return "not accepted"

    def parser(self, name: str) -> Callable[[Any], Any]:
        """A command-line option's parser: the refusal is printed as one ``error:`` line and
        the command exits 2 before it starts (a ``ValueError`` here would become the option
        parser's multi-line usage error)."""
        def parse(value: Any) -> Any:
            try:
                return self.check(value, name)
            except ConfigError as err:
                import typer

                typer.echo(f"error: {err}", err=True)
                raise typer.Exit(2) from None
        return parse


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str) and len(value) <= 40:
        text = value.strip().replace("_", "")
        try:
            return int(text)
        except ValueError:
            pass
        try:
            return float(text)
        except ValueError:
            return None
    return None


@dataclass(frozen=True, slots=True)
class Num(Spec):
    """An int or a finite float from ``lo`` to ``hi`` (both included)."""

    kind: type
    lo: float
    hi: float
    unit: str = ""

    def accepted(self) -> str:
        what = "an integer" if self.kind is int else "a finite number"
        unit = f" {self.unit}" if self.unit else ""
        return f"{what} from {_fmt(self.lo)} to {_fmt(self.hi)}{unit}"

    def unlike(self) -> str:
        return "not an integer" if self.kind is int else "not a finite number"

    def check(self, value: Any, name: str) -> Any:
        n = _number(value)
        if n is None or (isinstance(n, float) and not math.isfinite(n)):
            raise self.refuse(value, name)
        if self.kind is int:
            if isinstance(n, float):
                if not n.is_integer():
                    raise self.refuse(value, name)
                n = int(n)
        else:
            n = float(n)
        if not self.lo <= n <= self.hi:
            raise self.refuse(value, name, f"outside {_fmt(self.lo)}..{_fmt(self.hi)}")
        return n


@dataclass(frozen=True, slots=True)
class Ints(Spec):
    """A comma-separated list (or a sequence) of 1..``max_len`` integers from ``lo`` to ``hi``."""

    lo: int
    hi: int
    max_len: int = 16

    def accepted(self) -> str:
        return (f"1 to {self.max_len} comma-separated integers, each from {self.lo} to "
                f"{self.hi}")

    def unlike(self) -> str:
        return "not a list of integers in range"

    def check(self, value: Any, name: str) -> tuple[int, ...]:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not 1 <= len(items) <= self.max_len:
            raise self.refuse(value, name)
        each = Num(int, self.lo, self.hi)
        try:
            return tuple(each.check(x, name) for x in items)
        except ConfigError:
            raise self.refuse(value, name) from None


@dataclass(frozen=True, slots=True)
class Choice(Spec):
    values: tuple[str, ...]

    def accepted(self) -> str:
        return "one of " + ", ".join(self.values)

    def unlike(self) -> str:
        return "not a known choice"

    def check(self, value: Any, name: str) -> str:
        if not isinstance(value, str) or value not in self.values:
            raise self.refuse(value, name)
        return value


def check_all(specs: Mapping[str, Spec], prefix: str = "", **values: Any) -> dict[str, Any]:
    """Every value in ``values`` checked by its spec (named ``prefix + name``); typed values."""
    return {k: specs[k].check(v, prefix + k) for k, v in values.items()}
