"""Value types for counts and rates (argparse types; config values and keywords go through
them too): a bad value is a one-line error naming what was expected."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def number(convert: Callable[[str], float], accept: Callable[[float], bool], expected: str, name: str):
    """A value type: `convert` the text, then `accept` the value, else "expected EXPECTED"."""

    def parse(text: str):
        try:
            value = convert(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    parse.__name__ = parse.__qualname__ = name
    return parse


positive_int = number(int, lambda v: v >= 1, "a positive integer", "positive_int")
non_negative_int = number(int, lambda v: v >= 0, "an integer of 0 or more", "non_negative_int")
positive_float = number(float, lambda v: v > 0 and v != float("inf"), "a positive number", "positive_float")
non_negative_float = number(float, lambda v: v >= 0 and v != float("inf"), "a number of 0 or more",
                            "non_negative_float")
fraction = number(float, lambda v: 0.0 <= v <= 1.0, "a number from 0 to 1", "fraction")


def name_list(text: str) -> list[str]:
    """Two or more distinct, non-empty names separated by commas (`negative,positive`)."""
    names = [n.strip() for n in str(text).split(",")]
    if len(names) < 2 or not all(names):
        raise argparse.ArgumentTypeError(f"expected comma-separated names like negative,positive, got {text!r}")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"the names must differ, got {text!r}")
    return names


def comma_text(value):
    """A config's list (`[negative, positive]`) as the comma-separated text its flag takes."""
    return ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else value


def field_list(text: str) -> tuple[str, ...]:
    """Field names separated by commas (`id,source`)."""
    names = tuple(n.strip() for n in str(text).split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected field names separated by commas, got {text!r}")
    return names


DURATION_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600}


def duration(text) -> float:
    """Seconds from `300`, `90s`, `5m`, `5min` or `1.5h` (a positive amount)."""
    raw = str(text).strip().lower()
    unit = next((u for u in sorted(DURATION_UNITS, key=len, reverse=True) if raw.endswith(u)), "")
    try:
        value = float(raw[: len(raw) - len(unit)].strip()) * DURATION_UNITS.get(unit, 1)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a time such as 300, 90s, 5m or 1h, got {text!r}")
    return value


def said_seconds(seconds: float) -> str:
    """A duration as a line says it: `40 s`, `4 min 10 s`, `1 h 5 min`."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min" + (f" {seconds % 60} s" if seconds % 60 and seconds < 600 else "")
    return f"{seconds // 3600} h" + (f" {seconds % 3600 // 60} min" if seconds % 3600 // 60 else "")
