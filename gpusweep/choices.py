"""NetBox-style ChoiceSet: one class per status field, with named groups of values."""

from __future__ import annotations

from typing import ClassVar


class ChoiceSet:
    """Subclass with ``CHOICES = [(value, label), ...]`` and optional frozenset groups.

    ``Foo.choices()`` gives Django field choices; ``Foo.ACTIVE``/``Foo.TERMINAL`` style
    groups are plain frozensets declared on the subclass.
    """

    CHOICES: ClassVar[list[tuple[str, str]]] = []

    @classmethod
    def choices(cls) -> list[tuple[str, str]]:
        return list(cls.CHOICES)

    @classmethod
    def values(cls) -> list[str]:
        return [value for value, _label in cls.CHOICES]

    @classmethod
    def label(cls, value: str) -> str:
        return dict(cls.CHOICES).get(value, value)
