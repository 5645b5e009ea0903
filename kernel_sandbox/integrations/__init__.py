"""Drop-in executors for agent frameworks, on the execution API (no framework is imported).

:class:`SkillsExecutor` has the contract of LiteLLM's skills sandbox executor; :class:`ToolRunner`
that of Letta's tool execution sandbox. Both keep one warm kernel between calls.
"""

from __future__ import annotations

from .litellm import SkillsExecutor
from .letta import ToolExecutionResult, ToolRunner

__all__ = ["SkillsExecutor", "ToolExecutionResult", "ToolRunner"]
