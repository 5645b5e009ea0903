"""MkDocs hook: the options tables, written from the backends' settings models at every build.

A page asks for a table with a line ``<!-- options: docker -->`` (or ``opensandbox``); the hook
replaces it with one row per option of that backend's settings model: name, type, default and
the model's own help. So the reference cannot drift from the code: change the model, not the page.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from mkdocs.exceptions import PluginError

from kernel_sandbox import backends, parsers
from kernel_sandbox.settings import BackendSettings, parse_mounts

MODELS: dict[str, type[BackendSettings]] = {
    name: entry.settings_model() for name, entry in backends.entries().items()
}
"""Each registered backend's settings model, by its name (a new wing gets its table from the
registry)."""
_MARKER = re.compile(r"^<!-- options: (\w+) -->$", re.MULTILINE)

FORMS: dict[Any, str] = {
    parsers.parse_memory: "size or `unlimited`",
    parsers.parse_max_memory: "size or `unlimited`",
    parsers.parse_tmpfs: "size or `auto`",
    parsers.parse_cpus: "cores or `unlimited`",
    parsers.parse_pids: "int or `unlimited`",
    parsers.parse_max_kernels: "int or `unlimited`",
    parsers.parse_orphan_seconds: "seconds or `unlimited`",
    parsers.parse_seconds: "seconds",
    parsers.parse_id_range: "`LOW-HIGH`",
    parse_mounts: "list of mounts",
}
"""How a value is written, by the option's parser, where the model's field type (what the value
becomes) would mislead: ``memory`` becomes ``int | None`` but is written ``1g`` or ``unlimited``."""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(value: Any) -> str:
    if isinstance(value, tuple):
        value = list(value)
    if value is None:
        return "`null`"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    return f"`{json.dumps(value)}`"


def _choices(option: dataclasses.Field[Any]) -> tuple[str, ...] | None:
    """The option's enum values: its ``choices`` metadata, else those its parser closes over."""
    parse = option.metadata["parse"]
    cells = parse.__closure__ or ()
    captured = dict(zip(parse.__code__.co_freevars, (cell.cell_contents for cell in cells)))
    return option.metadata.get("choices") or captured.get("choices")


def _type(option: dataclasses.Field[Any]) -> str:
    choices = _choices(option)
    if choices:
        return " or ".join(f"`{choice}`" for choice in choices)
    form = FORMS.get(option.metadata["parse"])
    if form:
        return form
    written = re.sub(r"tuple\[([\w\[\], ]+?), \.\.\.\]", r"list[\1]", str(option.type))
    return " or ".join(f"`{part}`" for part in written.replace("None", "null").split(" | "))


def options_table(model: type[BackendSettings]) -> str:
    """The Markdown table of every option of ``model``: its own first, then the shared ones."""
    rows = ["| option | type | default | what it does |", "|---|---|---|---|"]
    shared = {option.name for option in dataclasses.fields(BackendSettings)}
    for name, option in sorted(model.options().items(), key=lambda item: item[0] in shared):
        default, help_ = _default(option.metadata["default"]), _cell(option.metadata["help"])
        rows.append(f"| `{name}` | {_type(option)} | {default} | {help_} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each ``<!-- options: NAME -->`` line with the table of that backend's model."""

    def table(match: re.Match[str]) -> str:
        if match[1] not in MODELS:
            where = page.file.src_uri if page is not None else "a page"
            known = ", ".join(MODELS)
            raise PluginError(f"{where}: no settings model named {match[1]!r}; known: {known}")
        return options_table(MODELS[match[1]])

    return _MARKER.sub(table, markdown)
