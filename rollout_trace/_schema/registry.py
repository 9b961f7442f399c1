"""The one registry of event classes: tags, emit checks and decoders.

``Event.__init_subclass__`` adds every class here as it is defined. The tracers
hold ``REGISTRY.emit_types`` itself (never a copy), so a class defined after a
tracer opened is still one it may emit.

Knowing a class's tag takes two steps, because msgspec stores the tag after
``__init_subclass__`` has run. A class without ``tag=`` gets its tag from
``default_tag``, which msgspec calls while building the class: that is where its
collisions are found, so that the ``class`` statement itself fails. A class
with an explicit ``tag=`` calls nothing of ours; its tag is read from the
finished class at the next ``settle()``, which runs when the next event class is
defined and before anything looks a tag up (decoders, ``event_types()``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, Union

import msgspec

from .._errors import EventTagError

# Event classes as the registry sees them: it is imported by the module that
# defines Event, so it names the base msgspec gives every one of them.
Event = msgspec.Struct

__all__ = ["REGISTRY", "EventRegistry", "snake_case"]

_T = TypeVar("_T")

_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def snake_case(name: str) -> str:
    """``GpuMemorySampled`` -> ``gpu_memory_sampled``; an acronym stays one word."""
    return _CAMEL_BOUNDARY.sub("_", name).lower()


def _simple_qualname(cls: type[Any]) -> str:
    # What msgspec hands a tag function: the qualname after any `<locals>`.
    return cls.__qualname__.rsplit(".<locals>.", 1)[-1]


def _origin_of(cls: type[Any]) -> tuple[str, str]:
    return cls.__module__, cls.__qualname__


def _name(cls: type[Any]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class EventRegistry:
    """Every event class, by tag, and what the tracers and readers derive from them.

    ``emit_types`` maps every event class ever defined to its ``urgent`` flag;
    ``emit_types.get(type(ev)) is None`` means "not an event". A class replaced
    by its redefinition stays in it, so objects made from the old class can
    still be emitted; a class rejected for its tag is taken out.
    """

    def __init__(self) -> None:
        self.emit_types: dict[type[Any], bool] = {}
        # Bumped whenever the set of tagged classes changes.
        self.version = 0
        self._by_tag: dict[str, type[Event]] = {}
        # (module, qualname) at definition -> the class that now holds it. Recorded
        # then, because built-in classes are renamed to `rollout_trace` afterwards.
        self._current: dict[tuple[str, str], type[Event]] = {}
        self._origin: dict[type[Any], tuple[str, str]] = {}
        self._pending: list[type[Event]] = []
        self._cache: dict[str, Any] = {}

    # --- defining classes -----------------------------------------------------

    def add(self, cls: type[Event]) -> None:
        """Take a class that ``Event.__init_subclass__`` is defining."""
        urgent = getattr(cls, "urgent", False)
        if type(urgent) is not bool:
            raise TypeError(
                f"{_name(cls)}.urgent must be a bool class "
                f"variable, declared `urgent: ClassVar[bool] = True`; got {urgent!r} "
                "(an `urgent: bool` annotation makes it a field on the wire)"
            )
        # Earlier classes with an explicit tag are finished by now: learn their
        # tags first, so this class is checked against them.
        self.settle()
        self._origin[cls] = _origin_of(cls)
        self._pending.append(cls)
        self.emit_types[cls] = urgent

    def default_tag(self, name: str) -> str:
        """The tag of a class defined without ``tag=``: its name in snake_case.

        msgspec calls this while it builds the class, after ``add``; a tag that
        another class holds fails the ``class`` statement here.
        """
        tag = snake_case(name)
        for cls in reversed(self._pending):
            if _simple_qualname(cls) == name:
                self._check(cls, tag)
                break
        return tag

    def settle(self) -> None:
        """Give every finished pending class its tag; raise for one that is taken."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        for i, cls in enumerate(pending):
            tag = cls.__struct_config__.tag
            if tag is None:
                # Not built yet (a class defined from inside another's
                # __init_subclass__), or msgspec refused it after `add`.
                self._pending.append(cls)
                continue
            try:
                self._accept(cls, tag)
            except EventTagError:
                self._pending += pending[i + 1 :]
                raise

    def _check(self, cls: type[Event], tag: object) -> str:
        """``tag`` if ``cls`` may hold it; else ``cls`` is forgotten and this raises."""
        if not isinstance(tag, str):
            self._forget(cls)
            raise EventTagError(
                f"event class {_name(cls)} has tag {tag!r}, but a tag must be a str "
                '(the "event" field of a line is a string): pass tag="..."',
                tag=tag,
                classes=(cls,),
            )
        old = self._by_tag.get(tag)
        if old is None or old is cls or self._origin[old] == self._origin[cls]:
            return tag
        self._forget(cls)
        raise EventTagError(
            f"event tag {tag!r} of class {_name(cls)} is taken by class {_name(old)}: "
            f'both would be written as {{"event": "{tag}"}} and a reader could not tell '
            "them apart (a class without tag= is tagged with its name in snake_case). "
            f"Give {_name(cls)} a tag of its own: "
            f'class {cls.__name__}(rt.Event, tag="...")',
            tag=tag,
            classes=(old, cls),
        )

    def _accept(self, cls: type[Event], tag: object) -> None:
        tag = self._check(cls, tag)
        origin = self._origin[cls]
        replaced = self._current.get(origin)
        if replaced is not None:
            # The same class defined again (a module reloaded, a notebook cell
            # run twice): the new one takes over, under its tag, which may differ.
            old_tag = replaced.__struct_config__.tag
            if isinstance(old_tag, str) and self._by_tag.get(old_tag) is replaced:
                del self._by_tag[old_tag]
            del self._origin[replaced]
        self._current[origin] = cls
        self._by_tag[tag] = cls
        self.version += 1
        self._cache.clear()

    def _forget(self, cls: type[Any]) -> None:
        self.emit_types.pop(cls, None)
        self._origin.pop(cls, None)
        if cls in self._pending:
            self._pending.remove(cls)

    # --- looking classes up -----------------------------------------------------

    def event_types(self) -> dict[str, type[Event]]:
        """Every event class (built-in and user), by tag: a copy."""
        self.settle()
        return dict(self._by_tag)

    def tags(self) -> frozenset[str]:
        """The tags lines are decoded by (those of ``decodable_types()``)."""
        return self.cached("tags", lambda: frozenset(self.decodable_types()))

    def cached(self, key: str, build: Callable[[], _T]) -> _T:
        """``build()``, kept until the next event class is defined.

        For anything derived from the set of classes (decoders over their
        union); ``key`` names it.
        """
        if self._pending:
            self.settle()
        try:
            value: _T = self._cache[key]
        except KeyError:
            value = self._cache[key] = build()
        return value

    def decodable_types(self) -> dict[str, type[Event]]:
        """The event classes lines can be decoded into, by tag.

        Every class but one whose annotations msgspec cannot resolve (a name
        that is not defined): one such class must not stop every read, and its
        lines are read as unknown events instead.
        """
        return self.cached("decodable", self._find_decodable)

    def _find_decodable(self) -> dict[str, type[Event]]:
        try:
            msgspec.json.Decoder(_union(self._by_tag.values()))
        except Exception:
            return {tag: cls for tag, cls in self._by_tag.items() if _decodable(cls)}
        return dict(self._by_tag)

    def decoders(self) -> tuple[msgspec.json.Decoder[Any], msgspec.json.Decoder[Any]]:
        """Decoders for one event and for a JSON array of events, over every class."""
        return self.cached("decoders", self._build_decoders)

    def _build_decoders(self) -> tuple[msgspec.json.Decoder[Any], msgspec.json.Decoder[Any]]:
        union: Any = _union(self.decodable_types().values())
        return msgspec.json.Decoder(union), msgspec.json.Decoder(list[union])


def _union(types: Iterable[type[Any]]) -> Any:
    members = tuple(types)
    return Union[members] if len(members) > 1 else members[0]  # noqa: UP007


def _decodable(cls: type[Any]) -> bool:
    try:
        msgspec.json.Decoder(cls)
    except Exception:
        return False
    return True


REGISTRY = EventRegistry()
