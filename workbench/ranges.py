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

__all__ = ["Num", "Ints", "Floats", "Choice", "Choices", "Flag", "Text", "Opt", "Pairs", "Spec",
           "check_all"]


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
        sep = "" if name.endswith("=") else " "  # "key=" names read as key=value
        if not sep and shown[:1] in "'\"":  # key='...' would read as a Python keyword hint
            shown = shown[1:-1] or "(empty)"
        return ConfigError(f"{name}{sep}{shown}", why or self.unlike(), f"pass {self.accepted()}")

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
    if isinstance(value, str) and len(value) <= 40 and value.isascii():
        # ASCII only: int() and float() also read Arabic-Indic (٣) and full-width (３) digits
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
        items = _items(value, self.max_len)
        if items is None:
            raise self.refuse(value, name)
        each = Num(int, self.lo, self.hi)
        try:
            return tuple(each.check(x, name) for x in items)
        except ConfigError:
            raise self.refuse(value, name) from None


def _items(value: Any, max_len: int) -> list | tuple | None:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not 1 <= len(items) <= max_len:
        return None
    return items


@dataclass(frozen=True, slots=True)
class Floats(Spec):
    """A comma-separated list (or a sequence) of 1..``max_len`` finite numbers from ``lo`` to
    ``hi``."""

    lo: float
    hi: float
    max_len: int = 16
    unit: str = ""

    def accepted(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return (f"1 to {self.max_len} comma-separated finite numbers, each from {_fmt(self.lo)} "
                f"to {_fmt(self.hi)}{unit}")

    def unlike(self) -> str:
        return "not a list of finite numbers in range"

    def check(self, value: Any, name: str) -> tuple[float, ...]:
        items = _items(value, self.max_len)
        if items is None:
            raise self.refuse(value, name)
        each = Num(float, self.lo, self.hi)
        try:
            return tuple(each.check(x, name) for x in items)
        except ConfigError:
            raise self.refuse(value, name) from None


@dataclass(frozen=True, slots=True)
class Choice(Spec):
    values: tuple[str, ...]

    def accepted(self) -> str:
        return "one of " + ", ".join(v or '""' for v in self.values)

    def unlike(self) -> str:
        return "not a known choice"

    def check(self, value: Any, name: str) -> str:
        if not isinstance(value, str) or value not in self.values:
            raise self.refuse(value, name)
        return value


@dataclass(frozen=True, slots=True)
class Choices(Spec):
    """A comma-separated list (or a sequence) of 1..``max_len`` choices from ``values``."""

    values: tuple[str, ...]
    max_len: int = 16

    def accepted(self) -> str:
        return f"1 to {self.max_len} comma-separated names from " + ", ".join(self.values)

    def unlike(self) -> str:
        return "not a list of known choices"

    def check(self, value: Any, name: str) -> tuple[str, ...]:
        items = _items(value, self.max_len)
        if not items or not all(isinstance(x, str) and x.strip() in self.values for x in items):
            raise self.refuse(value, name)
        return tuple(x.strip() for x in items)


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True, slots=True)
class Flag(Spec):
    """A bool, or its text: true/false, yes/no, on/off, 1/0."""

    def accepted(self) -> str:
        return "true or false"

    def unlike(self) -> str:
        return "not true or false"

    def check(self, value: Any, name: str) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        raise self.refuse(value, name)


@dataclass(frozen=True, slots=True)
class Text(Spec):
    """Free text (a folder, a name) of printable characters, at most ``max_len`` long."""

    max_len: int = 1024
    empty: bool = False  # whether "" is accepted

    def accepted(self) -> str:
        least = 0 if self.empty else 1
        return f"text of {least} to {self.max_len} printable characters"

    def check(self, value: Any, name: str) -> str:
        if not isinstance(value, str) or not (value or self.empty) \
                or len(value) > self.max_len or not value.isprintable():
            raise self.refuse(value, name)
        return value


@dataclass(frozen=True, slots=True)
class Opt(Spec):
    """``None`` (the text ``none``), or what ``spec`` accepts."""

    spec: Spec

    def accepted(self) -> str:
        return f"none or {self.spec.accepted()}"

    def check(self, value: Any, name: str) -> Any:
        if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
            return None
        try:
            return self.spec.check(value, name)
        except ConfigError as err:
            raise self.refuse(value, name, err.why) from None


@dataclass(frozen=True, slots=True)
class Pairs(Spec):
    """A name from ``names``, or comma-separated ``key=value`` pairs, each key's value checked
    by its :class:`Num` in ``keys`` (a step-time calibration, say)."""

    names: tuple[str, ...]
    keys: Mapping[str, Num]

    def accepted(self) -> str:
        pairs = ", ".join(f"{k} {n.accepted().removeprefix('a finite number ')}"
                          for k, n in self.keys.items())
        return f"one of {', '.join(self.names)}, or key=value pairs ({pairs})"

    def unlike(self) -> str:
        return "not a known name or key=value pairs"

    def check(self, value: Any, name: str) -> str:
        if not isinstance(value, str) or not value.isprintable() or len(value) > 400:
            raise self.refuse(value, name)
        if value in self.names:
            return value
        for part in value.split(","):
            key, sep, number = part.partition("=")
            if not sep or key.strip() not in self.keys:
                raise self.refuse(value, name)
            try:
                self.keys[key.strip()].check(number, name)
            except ConfigError:
                raise self.refuse(value, name) from None
        return value


def check_all(specs: Mapping[str, Spec], prefix: str = "", **values: Any) -> dict[str, Any]:
    """Every value in ``values`` checked by its spec (named ``prefix + name``); typed values."""
    return {k: specs[k].check(v, prefix + k) for k, v in values.items()}
