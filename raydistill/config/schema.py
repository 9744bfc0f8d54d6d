"""The schema library under every config: pydantic dataclasses, and pydantic's errors worded for a person.

A config section is a ``@section`` class: a pydantic dataclass that refuses unknown keys (``extra="forbid"``) and
NaN or infinity (``allow_inf_nan=False``), whose fields carry their meaning (``Field(description=...)``) and range
(``gt``, ``ge``, ``Literal``). ``build(cls, data, source=..., lines=...)`` validates plain data into one and turns the
first problem pydantic finds into a ``ConfigError`` worded ``<file>:<line>: field '<dotted path>': <what is wrong>``
(``--set field ...`` for a command-line override), with "did you mean" for a misspelt key or value: one problem at a
time, as a config is fixed a line at a time and the job scripts print the message's last line. ``fields_of`` lists
a section's fields for the generated ``--help``. A method's ``loss:`` and ``extra:`` are ``MethodSettings``: their
fields are the values the method uses, and each is also a read-only mapping of the keys the config set, as written.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Iterator, Union

import pydantic
from pydantic import BeforeValidator, ConfigDict, StrictFloat, StrictInt, ValidationError
from pydantic_core import PydanticCustomError

from raydistill.nested import non_finite_numbers

__all__ = ["ConfigError", "SECTION_CONFIG", "section", "MethodSettings", "Int", "Float", "Number", "build", "error_text", "where", "line_of", "suggest",
           "FieldDoc", "fields_of", "is_section", "finite_everywhere", "none_is_default", "str_is_list",
           "type_text", "constraint_text", "states"]


class ConfigError(ValueError):
    """A config problem, worded as ``<file>:<line>: field '<path>': <what is wrong>`` where the file is known."""


SECTION_CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False, defer_build=True)

#: ``@section``: a pydantic dataclass with the config rules (unknown keys and non-finite numbers refused).
section = functools.partial(pydantic.dataclasses.dataclass, config=SECTION_CONFIG)


def is_section(cls: Any) -> bool:
    return isinstance(cls, type) and dataclasses.is_dataclass(cls) and hasattr(cls, "__pydantic_fields__")


class MethodSettings(Mapping):
    """The base of a method's settings schema (a ``@section`` subclass): fields are the values in use, the mapping
    is the keys the config set, as written (``from_config`` records them; a section built in code sets none)."""

    _given: dict[str, Any] = {}  # not a field: the base is no dataclass, and the instance's own replaces it

    @classmethod
    def from_config(cls, data: Any, *, source: str | None, lines: dict[str, int], prefix: str, owner: str):
        """``data`` validated; an unknown key is "unknown field for <owner>" (the method the section belongs to)."""
        try:
            settings = build(cls, data, source=source, lines=lines, prefix=prefix)
        except ConfigError as exc:
            raise ConfigError(str(exc).replace(": unknown field", f": unknown field for {owner}", 1)) from None
        settings._given = dict(data)
        return settings

    def in_use(self) -> dict[str, Any]:
        """The keys the config set and the defaults that are not ``None``, validated: what the method is built
        with (a ``None`` default leaves the choice to the code it configures) and what a run records."""
        return {name: getattr(self, name) for name, info in type(self).__pydantic_fields__.items()
                if name in self._given or info.get_default(call_default_factory=True) is not None}

    def __getitem__(self, key: str) -> Any:
        return self._given[key]

    def __iter__(self):
        return iter(self._given)

    def __len__(self) -> int:
        return len(self._given)


# ----------------------------------------------------------------------------------------------------------------
# Validators shared by sections


def _refuse_bool(kind: str, expected: str):
    def check(value: Any) -> Any:
        if isinstance(value, bool):
            raise PydanticCustomError(kind, f"Input should be {expected}")
        return value
    return BeforeValidator(check)


def _number(value: Any) -> Any:
    """An int stays an int (a hashed value keeps its spelling), a numeric string is its number (YAML 1.1 reads
    ``1e-4`` as a string), anything else is refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise PydanticCustomError("number_type", "Input should be a number")
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise PydanticCustomError("number_type", "Input should be a number") from None
    return value


#: ``int`` without ``true``/``false`` (pydantic's lax int takes a bool for 1/0; a config never means that).
Int = Annotated[int, _refuse_bool("int_type", "a valid integer")]
#: ``float`` without ``true``/``false``; ints become floats, as ``float`` fields always did.
Float = Annotated[float, _refuse_bool("float_type", "a valid number")]
#: A number that keeps its int or float kind: free-form values (``loss:``) are hashed as written.
Number = Annotated[Union[StrictInt, StrictFloat], BeforeValidator(_number)]


def none_is_default(value: Any) -> Any:
    """A section written as ``train:`` with nothing under it (YAML null) is the section's defaults."""
    return {} if value is None else value


def str_is_list(value: Any) -> Any:
    """``teacher_views: a`` means ``[a]``."""
    return [value] if isinstance(value, str) else value


def finite_everywhere(value: Any) -> Any:
    """NaN or infinity anywhere in a free-form mapping (``loss``, ``extra``): no setting means either, and a NaN
    temperature would train a broken model until the first check notices."""
    for path, item in non_finite_numbers(value):
        raise PydanticCustomError("non_finite", "expected a finite number, got {got}",
                                  {"subpath": path, "got": repr(item)})
    return value


# ----------------------------------------------------------------------------------------------------------------
# Building


def build(cls: type, data: Any, *, source: str | None = None, lines: dict[str, int] | None = None,
          prefix: str = "", error: type[ConfigError] = ConfigError):
    """``cls`` validated from ``data``; the first problem raises ``error`` naming the file, line and field."""
    lines = lines or {}
    if not isinstance(data, dict):
        raise error(where(source, lines, prefix.rstrip(".")) + f"expected a mapping of {cls.__name__} fields, got "
                    f"{data!r}")
    private = [key for key in data if isinstance(key, str) and key.startswith("_")]
    if private:  # dataclass bookkeeping (_source, _lines) is never a config key
        path = prefix + private[0]
        raise error(where(source, lines, path) + _unknown_key(cls, private[0], prefix))
    try:
        return _adapter(cls).validate_python(data)
    except ValidationError as exc:
        path, message = error_text(cls, exc, prefix)
        raise error(where(source, lines, path) + message) from None


@functools.lru_cache(maxsize=None)
def _adapter(cls: type) -> pydantic.TypeAdapter:
    return pydantic.TypeAdapter(cls)


def error_text(cls: Any, exc: ValidationError, prefix: str = "") -> tuple[str, str]:
    """``(dotted path, message)`` of the first error of ``exc`` raised while validating ``cls``."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    path, owner, name = _resolve(cls, first["loc"], prefix)
    kind = first["type"]
    same_field = {e["type"] for e in errors if _resolve(cls, e["loc"], prefix)[0] == path}
    if len(same_field) > 1 and same_field & _NUMBER_ERRORS:  # the members of a union (int | float) each refused
        if "finite_number" in same_field:
            kind = "finite_number"
        elif same_field <= _NUMBER_ERRORS:
            return path, f"expected a number, got {first.get('input')!r}"
    got = first.get("input")
    ctx = first.get("ctx") or {}
    if kind in ("missing", "missing_argument"):
        parent = path.rpartition(".")[0]
        missing = [_resolve(cls, e["loc"], prefix)[0] for e in errors if e["type"] in ("missing", "missing_argument")
                   and _resolve(cls, e["loc"], prefix)[0].rpartition(".")[0] == parent]
        return parent, f"missing required field(s): {', '.join(missing)}"
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        return path, _unknown_key(owner, name, path.rpartition(".")[0] + "." if "." in path else "")
    if kind == "non_finite":
        sub = ctx.get("subpath", "")
        full = f"{path}.{sub}" if sub and not sub.startswith("[") else f"{path}{sub}"
        return full, f"expected a finite number, got {ctx.get('got')}"
    return path, _message(kind, got, ctx, first, owner, name)


_NUMBER_ERRORS = {"int_type", "int_parsing", "int_from_float", "float_type", "float_parsing", "finite_number"}


# What a type error expects, by pydantic error type.
_EXPECTED = {**dict.fromkeys(("int_type", "int_parsing", "int_from_float", "int_parsing_size"), "an integer"),
             **dict.fromkeys(("bool_type", "bool_parsing"), "true or false"),
             **dict.fromkeys(("float_type", "float_parsing", "finite_number"), "a finite number"),
             **dict.fromkeys(("dict_type", "mapping_type"), "a mapping"), "number_type": "a number",
             "string_type": "a string",
             **dict.fromkeys(("dataclass_type", "dataclass_exact_type", "model_type", "model_attributes_type"),
                             "a mapping of fields"),
             **dict.fromkeys(("list_type", "tuple_type", "iterable_type"), "a list")}


def _message(kind: str, got: Any, ctx: dict, error: dict, owner: Any, name: str | None) -> str:
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {got!r}"
    if kind == "literal_error":
        info = _field_info(owner, name)
        allowed = list(_literals(info.annotation)) if info is not None else []
        return f"{got!r} is not one of {', '.join(map(str, allowed))}{suggest(str(got), allowed)}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        bounds = _bounds(_field_info(owner, name))
        if bounds.get("ge") is not None and bounds.get("lt") is not None:
            return f"{got!r} must be in [{bounds['ge']:g}, {bounds['lt']:g})"
        if kind == "greater_than":
            return f"must be > {ctx['gt']:g}, got {got!r}"
        op = {"greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[kind]
        return f"{got!r} must be {op} {next(iter(ctx.values())):g}"
    if kind in ("string_too_short", "too_short") and ctx.get("min_length") == 1:
        return f"must not be empty, got {got!r}"
    if kind in ("value_error", "assertion_error") and "error" in ctx:
        return str(ctx["error"])
    return f"{error['msg'][0].lower()}{error['msg'][1:]}, got {got!r}"


def _unknown_key(owner: Any, key: Any, section_prefix: str) -> str:
    names = [n for n in getattr(owner, "__pydantic_fields__", {}) if not n.startswith("_")]
    where_ = section_prefix.rstrip(".") or "the top level"
    return f"unknown field{suggest(str(key), names)}; allowed in {where_}: {', '.join(names)}"


def _resolve(cls: Any, loc: tuple, prefix: str) -> tuple[str, Any, str | None]:
    """``(dotted path, the section class holding the last field, the field's name)`` of a pydantic ``loc``.

    pydantic adds the tags of union members and validators to ``loc`` (``'int'``, ``'function-after[...]'``); only
    the steps that a config path names are kept."""
    path = prefix.rstrip(".")
    node: Any = cls
    owner, name = cls, None
    for step in loc:
        hint = _unwrap(node)
        if isinstance(step, int):
            path += f"[{step}]"
            node = _item_type(hint)
            continue
        if is_section(hint):
            owner, name = hint, str(step)
            path = f"{path}.{step}" if path else str(step)
            field = hint.__pydantic_fields__.get(str(step))
            node = field.annotation if field is not None else None
        elif typing.get_origin(hint) is dict:
            path = f"{path}.{step}" if path else str(step)
            node = typing.get_args(hint)[1] if typing.get_args(hint) else None
            owner, name = None, str(step)
        # else: a union or validator tag; the path does not change
    return path, owner, name


def _unwrap(hint: Any) -> Any:
    """The section, dict or list type inside ``Annotated[...]`` and ``X | None``."""
    while True:
        origin = typing.get_origin(hint)
        if origin is typing.Annotated:
            hint = typing.get_args(hint)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            inner = [a for a in args if is_section(_unwrap(a)) or typing.get_origin(_unwrap(a)) in (dict, list)]
            hint = inner[0] if inner else (args[0] if len(args) == 1 else None)
            if hint is None:
                return None
        else:
            return hint


def _item_type(hint: Any) -> Any:
    args = typing.get_args(hint)
    return args[0] if typing.get_origin(hint) in (list, tuple) and args else None


def _field_info(owner: Any, name: str | None):
    return getattr(owner, "__pydantic_fields__", {}).get(name) if name else None


def _bounds(info) -> dict[str, Any]:
    """A field's ``gt``/``ge``/``lt``/``le`` bounds (``info``: its pydantic FieldInfo, or None)."""
    return {key: getattr(item, key) for item in getattr(info, "metadata", []) or []
            for key in ("gt", "ge", "lt", "le") if getattr(item, key, None) is not None}


def _literals(hint: Any) -> tuple:
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return typing.get_args(hint)
    return tuple(v for arg in typing.get_args(hint) for v in _literals(arg))


# ----------------------------------------------------------------------------------------------------------------
# Locations and suggestions


def where(source: str | None, lines: dict[str, int], path: str) -> str:
    """``<file>:<line>: field '<path>': `` (``--set field ...`` when the value came from the command line)."""
    line = line_of(lines, path)
    if line == 0:
        location = "--set "
    elif source:
        location = f"{source}:{line}: " if line else f"{source}: "
    else:
        location = ""
    return f"{location}field '{path}': " if path else location


def line_of(lines: dict[str, int], path: str) -> int | None:
    """The line of ``path``, else of its closest ancestor with a known line (a default filled in under a section
    points at the section); 0 means the command line."""
    while path:
        if path in lines:
            return lines[path]
        path = path[:path.rindex("[")] if path.endswith("]") else path.rpartition(".")[0]
    return None


def suggest(name: str, choices) -> str:
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


# ----------------------------------------------------------------------------------------------------------------
# Documentation of the fields (the generated --help)


@dataclasses.dataclass(frozen=True)
class FieldDoc:
    """One field as ``--help`` shows it."""

    path: str
    type: str
    default: Any  # dataclasses.MISSING for a required field
    description: str | None
    section: type | None  # the nested section it holds (or a list of), else None
    is_list: bool = False


def fields_of(cls: type, prefix: str = "") -> Iterator[FieldDoc]:
    """Every field of the section ``cls`` and of the sections it nests, depth first, in declaration order."""
    for name, info in cls.__pydantic_fields__.items():
        if name.startswith("_"):
            continue
        path = f"{prefix}{name}"
        hint = _unwrap(info.annotation)
        nested, is_list = (hint, False) if is_section(hint) else (None, False)
        if nested is None and typing.get_origin(hint) in (list, tuple) and is_section(_item_type(hint)):
            nested, is_list = _item_type(hint), True
        default = info.get_default(call_default_factory=True) if not info.is_required() else dataclasses.MISSING
        yield FieldDoc(path, type_text(info.annotation) + constraint_text(info), default, info.description, nested,
                       is_list)
        if nested is not None:
            yield from fields_of(nested, f"{path}[]." if is_list else f"{path}.")


def type_text(hint: Any) -> str:
    """A type as a user writes its values: ``int``, ``number``, ``true|false``, ``'a'|'b'``, ``int|null``."""
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return type_text(typing.get_args(hint)[0])
    if origin is typing.Literal:
        return "|".join(str(v) for v in typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        parts = [type_text(a) for a in typing.get_args(hint) if a is not type(None)]
        if set(parts) == {"int", "number"}:
            parts = ["number"]
        return "|".join(dict.fromkeys(parts)) + ("|null" if type(None) in typing.get_args(hint) else "")
    if origin in (list, tuple):
        args = typing.get_args(hint)
        return f"list[{type_text(args[0])}]" if args else "list"
    if origin is dict:
        args = typing.get_args(hint)
        return f"map[{type_text(args[0])}: {type_text(args[1])}]" if args else "map"
    if is_section(hint):
        return "section"
    names = {int: "int", float: "number", bool: "true|false", str: "str", type(None): "null"}
    if hint in names:
        return names[hint]
    if hint is Any:
        return "any"
    return getattr(hint, "__name__", str(hint))


def states(constraint: str):
    """Marks a validator function with the range it enforces (``"> 0"``), for the help's type column."""
    def mark(func):
        func.constraint = constraint
        return func
    return mark


def constraint_text(info) -> str:
    """``' > 0'``, ``' >= 0'``, ``' in [0, 1)'`` from a field's bounds and marked validators ('' when none)."""
    for item in getattr(info, "metadata", []) or []:
        stated = getattr(getattr(item, "func", None), "constraint", None)
        if stated:
            return f" {stated}"
    bounds = _bounds(info)
    if not bounds:
        return ""
    if len(bounds) == 2:
        low = f"[{bounds['ge']:g}" if "ge" in bounds else f"({bounds.get('gt', 0):g}"
        high = f"{bounds['le']:g}]" if "le" in bounds else f"{bounds.get('lt', 0):g})"
        return f" in {low}, {high}"
    (key, value), = bounds.items()
    return f" {dict(gt='>', ge='>=', lt='<', le='<=')[key]} {value:g}"
