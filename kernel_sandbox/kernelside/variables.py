"""The user's variables, listed inside the kernel for ``kernel-sandbox mcp``'s ``list_variables``.

Its source is sent with ``run_tool`` (so nothing of this package needs to be in the image); what
comes back is plain data: names, type names and a short repr.
"""

from __future__ import annotations


def list_variables(limit: int = 200, repr_chars: int = 120) -> list[dict[str, str]]:
    """``[{"name", "type", "repr"}]`` for the names the user defined (modules and IPython's own
    names left out), the first ``limit`` of them in sorted order."""
    import types

    from IPython import get_ipython

    shell = get_ipython()
    hidden = shell.user_ns_hidden
    found = []
    for name in sorted(shell.user_ns):
        value = shell.user_ns[name]
        if name.startswith("_") or name in hidden or isinstance(value, types.ModuleType):
            continue
        try:
            text = repr(value)
        except Exception as exc:  # a repr that fails is reported, not raised
            text = f"<repr failed: {type(exc).__name__}>"
        if len(text) > repr_chars:
            text = text[: repr_chars - 3] + "..."
        found.append({"name": name, "type": type(value).__name__, "repr": text})
        if len(found) >= limit:
            break
    return found
