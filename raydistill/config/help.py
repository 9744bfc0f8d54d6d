"""``--help`` text for a job's config fields, generated from the schema.

Every row comes from a field of the config's sections (``raydistill.config.schema.fields_of``): its dotted path,
the value in the job's default config, its type and range, its default where the config differs from it, and its
``Field(description=...)``. ``loss:`` and ``extra:`` list the settings the config's method declares, and ``method``
the registered methods. This module sits below ``raydistill.methods``, so the methods register themselves here
(``register_method``) when that package is imported; until then ``loss``/``extra`` show the keys the config sets.

    print(config_fields_help(JobConfig, shipped_values))
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any

from raydistill.config.schema import fields_of, is_section

__all__ = ["MethodDoc", "METHOD_DOCS", "register_method", "job_method_names", "config_field_rows",
           "config_fields_help", "settings_rows"]


@dataclasses.dataclass(frozen=True)
class MethodDoc:
    """What ``--help`` shows of one method: its summary and the schemas of its ``loss:`` and ``extra:``."""

    name: str
    summary: str
    loss_settings: type | None
    extra_settings: type | None
    internal: bool = False


#: Registered by ``raydistill.methods`` as it discovers its methods.
METHOD_DOCS: dict[str, MethodDoc] = {}

_FREE_FORM = ("loss", "extra")  # the sections whose schema is the method's
_WIDTH = 118


def register_method(name: str, summary: str, loss_settings: type | None, extra_settings: type | None, *,
                    internal: bool = False) -> None:
    METHOD_DOCS[name] = MethodDoc(name, summary, loss_settings, extra_settings, internal)


def job_method_names() -> list[str]:
    """The methods a job config may name (later stages of other methods left out), as registered."""
    return sorted(name for name, doc in METHOD_DOCS.items() if not doc.internal)


def config_field_rows(cls: type, prefix: str = "") -> list[tuple[str, str | None]]:
    """``(dotted path, description or None)`` for every field of ``cls`` and its nested sections; a nested
    section has no row of its own, a list of sections has one (``families``, then ``families[].name`` ...)."""
    return [(doc.path, doc.description) for doc in fields_of(cls, prefix) if doc.section is None or doc.is_list]


def settings_rows(schema: type, prefix: str) -> list[tuple[str, str, Any, str | None]]:
    """``(path, type, default, description)`` of each field of a method's settings schema."""
    return [(doc.path, doc.type, doc.default, doc.description) for doc in fields_of(schema, prefix)]


def _show(value: Any) -> str:
    """A value as it would be written in the YAML file."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_show(v)}" for k, v in value.items()) + "}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return "{...}"
    return str(value)


def _row(indent: str, path: str, value: str | None, kind: str, description: str | None) -> str:
    head = f"{indent}{path}" + (f" = {value}" if value is not None else "") + f"  [{kind}]"
    text = f"{head}  {description or ''}".rstrip()
    if len(text) <= _WIDTH:
        return text
    return "\n".join(textwrap.wrap(text, width=max(_WIDTH, len(head) + 50), subsequent_indent=indent + "      ",
                                   break_on_hyphens=False))


def _kind(doc_type: str, default: Any, value: Any, has_value: bool) -> str:
    if default is dataclasses.MISSING:
        return f"{doc_type}, required"
    if has_value and value == default:
        return doc_type
    return f"{doc_type}, default {_show(default)}"


def _lookup(values: Any, relative: str) -> tuple[bool, Any]:
    node = values
    for part in relative.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def config_fields_help(cls: type, shipped: dict[str, Any] | None = None) -> str:
    """The help block: one row per field, ``path = value  [type, default]  description``, values from ``shipped``
    (the default config's plain data) where it sets the field. ``loss.*``/``extra.*`` list the settings of the
    config's method (and any key ``shipped`` sets that the method does not declare)."""
    shipped = shipped or {}
    method = shipped.get("method") if isinstance(shipped, dict) else None
    lines = []
    for doc in fields_of(cls):
        if doc.section is not None and not doc.is_list:
            continue
        if doc.path in _FREE_FORM and doc.section is None:
            lines += _free_form_rows(doc, method, shipped.get(doc.path) or {})
            continue
        has_value, value = _lookup(shipped, doc.path)
        description = doc.description
        if doc.path == "method" and METHOD_DOCS:
            own = f"{value} (this job's own) or " if has_value and value not in METHOD_DOCS else ""
            description = f"{description}: {own}{', '.join(job_method_names())}"
        shown = _show(value) if has_value and not is_section(type(value)) else None
        lines.append(_row("  ", doc.path, shown, _kind(doc.type, doc.default, value, has_value), description))
    return "\n".join(lines)


def _free_form_rows(doc, method: str | None, values: dict[str, Any]) -> list[str]:
    registered = METHOD_DOCS.get(method or "")
    schema = None if registered is None else (registered.loss_settings if doc.path == "loss"
                                              else registered.extra_settings)
    owner = f"the {method} method's" if registered is not None else "the method's"
    lines = [_row("  ", f"{doc.path}.*", None, "map", doc.description
                  + (f"; {owner}: {schema.__name__}" if schema is not None else ""))]
    declared = set()
    if schema is not None:
        for field in fields_of(schema, f"{doc.path}."):
            relative = field.path[len(doc.path) + 1:]
            declared.add(relative.split(".")[0])
            has_value, value = _lookup(values, relative)
            shown = _show(value) if has_value and field.section is None else None
            indent = "    " + "  " * relative.count(".")
            lines.append(_row(indent, field.path, shown, _kind(field.type, field.default, value, has_value),
                              field.description))
    for key in sorted(set(values) - declared):
        lines.append(_row("    ", f"{doc.path}.{key}", _show(values[key]), "any",
                          "method-specific" if schema is None else "not a setting of this method"))
    return lines
