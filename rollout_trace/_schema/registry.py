"""The one registry of event classes: tags, emit checks and decoders.

``Event.__init_subclass__`` adds every class here as it is defined. The tracers
hold ``REGISTRY.emit_types`` itself (never a copy), so a class defined after a
tracer opened is still one it may emit.

Knowing a class's tag takes two steps, because msgspec stores the tag after
``__init_subclass__`` has run. A class without ``tag=`` gets its tag from
``default_tag``, which msgspec calls while building the class: that is where its
collisions are found, so that the ``class`` statement itself fails. A class
with an explicit ``tag=`` calls nothing of ours; its tag, and every other
option that decides what its line looks like (``array_like``, ``tag_field``,
``rename``), is read from the finished class at the next ``settle()``, which
runs when the next event class is defined, before anything looks a tag up
(decoders, ``event_types()``), and when ``emit`` first meets the class
(``emit_type``). Only then may it be emitted: a class whose lines no reader
would take is refused there, and is in no table; the settle that finds it
logs a warning naming it, and every ``emit`` of it raises ``EventTagError``.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, Union

import msgspec

from .._errors import EventTagError

# Event classes as the registry sees them: it is imported by the module that
# defines Event, so it names the base msgspec gives every one of them.
Event = msgspec.Struct

__all__ = ["REGISTRY", "EventRegistry", "not_an_event_type", "snake_case"]

_T = TypeVar("_T")
_log = logging.getLogger("rollout_trace")

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


def not_an_event_type(cls: type[Any], shown: str = "") -> TypeError:
    """What ``emit`` raises for an object of type ``cls``, which is no event
    class; ``shown`` is the object's repr (with its leading ": "), if known."""
    if not shown and isinstance(cls, type) and issubclass(cls, type):
        shown = " (a class: emit an instance of it)"
    return TypeError(f"emit() takes a rollout_trace.Event, not {cls.__qualname__}{shown}")


def _finished(cls: type[Any]) -> bool:
    # msgspec sets a class's fields and then its options (tag, tag_field,
    # array_like, rename) in one step of C, after `__init_subclass__` and the
    # tag function have run; until then `__struct_fields__` is an unset slot,
    # which raises AttributeError (inherited fields do not stand in for it).
    try:
        cls.__struct_fields__  # noqa: B018
    except AttributeError:
        return False
    return True


# The envelope: what a reader finds every line by, under these names and types.
_ENVELOPE = {"time": float, "run_id": str, "seq": int}
_ALLOWED = (
    "An event class must be an object-like struct (no array_like=True) with its tag "
    'in the field "event" (no tag_field=, no tag=False), a str tag no other class '
    "holds, and the envelope fields time (float), run_id (str) and seq (int) as the "
    "base class has them"
)


def _wire_problem(cls: type[Event]) -> str | None:
    """What makes the lines of finished class ``cls`` unreadable, if anything
    its tag aside: msgspec takes these options as it would for any struct."""
    config = cls.__struct_config__
    if config.array_like:
        return "array_like=True writes each event as a JSON array, not an object"
    if config.tag_field is None:
        return 'tag=False writes its events without the "event" field'
    if config.tag_field != "event":
        return f'tag_field={config.tag_field!r} writes its tag under that name, not "event"'
    for name, wire in zip(cls.__struct_fields__, cls.__struct_encode_fields__, strict=True):
        if name in _ENVELOPE and wire != name:
            return f"its rename= writes the envelope field {name!r} as {wire!r}"
    # The tracer stamps these, and every reader takes a line by them.
    hints = getattr(cls, "__annotations__", {})
    for name, kind in _ENVELOPE.items():
        declared = hints.get(name)
        if declared is not None and declared not in (kind, kind.__name__):
            return f"it declares the envelope field {name!r} as {declared!r}, not {kind.__name__}"
    return None


class EventRegistry:
    """Every event class, by tag, and what the tracers and readers derive from them.

    ``emit_types`` maps every event class that is settled and accepted to its
    ``urgent`` flag: the tracers' fast path. A class missing from it is one
    to ask ``emit_type`` about: one not settled yet, a refused one, or no
    event class at all. A class replaced by its redefinition stays in it, so
    objects made from the old class can still be emitted; a refused class is
    never in it, nor in any decoder.
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
        # A refused class -> what EventTagError says of it (raised afresh each
        # time: one instance raised again and again would pile up tracebacks).
        self._refused: dict[type[Any], tuple[str, object, tuple[type, ...]]] = {}
        # Refused while settling, and not raised yet: the next settle() raises.
        self._unreported: list[type[Any]] = []
        # Settling from many threads at once (emit's slow path) must not let
        # one see a class another has taken out of _pending but not accepted.
        self._lock = threading.RLock()

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
        with self._lock:
            self.settle()
            self._origin[cls] = _origin_of(cls)
            self._pending.append(cls)

    def default_tag(self, name: str) -> str:
        """The tag of a class defined without ``tag=``: its name in snake_case.

        msgspec calls this while it builds the class, after ``add``; a tag that
        another class holds fails the ``class`` statement here.
        """
        tag = snake_case(name)
        with self._lock:
            for cls in reversed(self._pending):
                if _simple_qualname(cls) == name:
                    self._check(cls, tag)
                    break
        return tag

    def settle(self) -> None:
        """Accept every finished pending class, or refuse it (it is then in no
        table, and ``emit`` raises ``EventTagError`` for its events); a refusal
        not told yet is logged once as a warning here. It never raises: the
        lookup that settles may be an unrelated read, or another library's
        class statement, which a class it has nothing to do with must not break."""
        with self._lock:
            if self._pending:
                self._settle()
            while self._unreported:
                _log.warning("rollout_trace: %s", self._refusal(self._unreported.pop(0)))

    def emit_type(self, cls: type) -> bool:
        """The ``urgent`` flag of event class ``cls``: ``emit``'s slow path, for
        a class not in ``emit_types``.

        Settles pending classes first, so a class defined since is found, and
        raises only for ``cls`` itself: ``EventTagError`` (a ``TypeError``)
        if it is refused, ``TypeError`` if it is no event class.
        """
        urgent = self.emit_types.get(cls)
        if urgent is not None:
            return urgent
        with self._lock:
            if self._pending:
                self._settle()
            urgent = self.emit_types.get(cls)
            if urgent is not None:
                return urgent
            if cls in self._refused:
                if cls in self._unreported:  # said here: not again at a lookup
                    self._unreported.remove(cls)
                raise self._refusal(cls)
            if cls in self._origin:
                # Its class statement has not finished (emitted from inside
                # another class's __init_subclass__, say).
                raise TypeError(
                    f"event class {_name(cls)} is still being defined: emit its "
                    "events once its class statement has run"
                )
        raise not_an_event_type(cls)

    def _settle(self) -> None:
        pending, self._pending = self._pending, []
        for cls in pending:
            if not _finished(cls):
                # Not built yet (a class defined from inside another's
                # __init_subclass__), or msgspec refused it after `add`.
                self._pending.append(cls)
                continue
            try:
                self._accept(cls)
            except EventTagError:
                self._unreported.append(cls)

    def _refuse(
        self, cls: type[Any], message: str, tag: object, classes: tuple[type, ...]
    ) -> EventTagError:
        """Take ``cls`` out of every table for good; the error to raise for it."""
        self._forget(cls)
        self._refused[cls] = (message, tag, classes)
        return self._refusal(cls)

    def _refusal(self, cls: type[Any]) -> EventTagError:
        message, tag, classes = self._refused[cls]
        return EventTagError(message, tag=tag, classes=classes)

    def _check(self, cls: type[Event], tag: object) -> str:
        """``tag`` if ``cls`` may hold it; else ``cls`` is forgotten and this raises."""
        if not isinstance(tag, str):
            raise self._refuse(
                cls,
                f"event class {_name(cls)} has tag {tag!r}, but a tag must be a str "
                '(the "event" field of a line is a string): pass tag="..."',
                tag,
                (cls,),
            )
        old = self._by_tag.get(tag)
        if old is None or old is cls or self._origin[old] == self._origin[cls]:
            return tag
        raise self._refuse(
            cls,
            f"event tag {tag!r} of class {_name(cls)} is taken by class {_name(old)}: "
            f'both would be written as {{"event": "{tag}"}} and a reader could not tell '
            "them apart (a class without tag= is tagged with its name in snake_case). "
            f"Give {_name(cls)} a tag of its own: "
            f'class {cls.__name__}(rt.Event, tag="...")',
            tag,
            (old, cls),
        )

    def _accept(self, cls: type[Event]) -> None:
        """Let finished class ``cls`` be emitted and read, or refuse it."""
        config = cls.__struct_config__
        problem = _wire_problem(cls)
        if problem is not None:
            raise self._refuse(
                cls,
                f"event class {_name(cls)} cannot be written as event lines a reader "
                f"takes: {problem}. {_ALLOWED}",
                config.tag,
                (cls,),
            )
        tag = self._check(cls, config.tag)
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
        # Checked to be a bool by `add`; emittable only now.
        self.emit_types[cls] = getattr(cls, "urgent", False)

    def _forget(self, cls: type[Any]) -> None:
        self.emit_types.pop(cls, None)
        self._origin.pop(cls, None)
        if cls in self._pending:
            self._pending.remove(cls)

    def superseded_by(self, cls: type[Any]) -> type[Event] | None:
        """The class now holding the tag of emittable class ``cls``, if another
        does: ``cls`` was defined again (a reloaded module, a test or notebook
        cell run twice), and its lines are read back as the new class."""
        if self._pending:
            self.settle()  # a class defined since then may be the new holder
        tag = cls.__struct_config__.tag
        holder = self._by_tag.get(tag) if isinstance(tag, str) else None
        return None if holder is None or holder is cls else holder

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
        if self._pending or self._unreported:
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
