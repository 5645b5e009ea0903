"""A sandbox's ``networkPolicy`` as the lifecycle API takes and answers it, checked for shape both
ways: what the server answers is rebuilt, never passed on as it came."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import OpenSandboxProtocolError

MAX_POLICY_RULES = 4096
"""The most egress rules a policy may hold (the server's answer or ours)."""


def policy_of(answer: Mapping[str, Any], what: str) -> dict[str, Any]:
    """A networkPolicy rebuilt from ``answer``: ``defaultAction`` (allow/deny, kept only when given)
    and ``egress`` rules of ``{"action": allow|deny, "target": name}``; anything else raises."""
    default = answer.get("defaultAction")
    rules = answer.get("egress") or []
    if (
        default not in (None, "allow", "deny")
        or not isinstance(rules, list)
        or len(rules) > MAX_POLICY_RULES
    ):
        raise OpenSandboxProtocolError(
            f"{what}: not a networkPolicy (defaultAction allow|deny, egress a list of rules)"
        )
    egress = []
    for rule in rules:
        if (
            not isinstance(rule, Mapping)
            or rule.get("action") not in ("allow", "deny")
            or not isinstance(rule.get("target"), str)
            or not 0 < len(rule["target"]) <= 253
        ):
            raise OpenSandboxProtocolError(
                f"{what}: an egress rule is not {{action: allow|deny, target: name}}: "
                f"{str(rule)[:200]}"
            )
        egress.append({"action": rule["action"], "target": rule["target"]})
    return {**({"defaultAction": default} if default else {}), "egress": egress}
