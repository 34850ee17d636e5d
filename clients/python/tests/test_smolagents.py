"""smolagents (from PyPI, pinned in scripts/python-env.sh) on a real
``corral serve`` through its E2B executor: smolagents' own ``E2BExecutor``
(the real e2b-code-interpreter SDK underneath) runs code in a corral code
context, and a ``CodeAgent(executor_type="e2b")`` runs its steps there,
with state kept between steps and its final answer returned.

No LLM is reachable from here, so the agent's model is a test double,
``ScriptedModel``: it answers each step with the next scripted reply and
records what the agent showed it, so the test sees the observations that
came back from the sandbox. Everything else (the agent loop, its prompt,
code parsing, the executor, the SDK, the service, the kernel) is real.
Needs the offline image ``corral-test/python``."""

from __future__ import annotations

from typing import Any, List

import pytest

smolagents = pytest.importorskip("smolagents")
pytest.importorskip("e2b_code_interpreter")
from smolagents import CodeAgent, FinalAnswerTool  # noqa: E402
from smolagents.models import ChatMessage, MessageRole, Model  # noqa: E402
from smolagents.monitoring import AgentLogger, LogLevel, TokenUsage  # noqa: E402
from smolagents.remote_executors import E2BExecutor  # noqa: E402
from smolagents.utils import AgentError  # noqa: E402

# The E2B service fixture (a real `corral serve` with its E2B listener and
# the code-interpreter profile; E2B_* variables set while it runs).
from test_e2b_code import e2b_server  # noqa: E402,F401

pytestmark = pytest.mark.server


class ScriptedModel(Model):
    """Test double for an LLM: replies with the scripted messages in order
    and keeps every prompt it was given."""

    def __init__(self, replies: List[str]) -> None:
        super().__init__(model_id="scripted")
        self.replies = list(replies)
        self.prompts: List[list] = []

    def generate(self, messages: list, stop_sequences: Any = None, response_format: Any = None,
                 tools_to_call_from: Any = None, **kwargs: Any) -> ChatMessage:
        self.prompts.append(messages)
        if not self.replies:
            raise AssertionError("the agent asked for more steps than were scripted")
        return ChatMessage(
            role=MessageRole.ASSISTANT,
            content=self.replies.pop(0),
            token_usage=TokenUsage(input_tokens=0, output_tokens=0),
        )


def prompt_text(messages: list) -> str:
    parts = []
    for m in messages:
        content = m.content if hasattr(m, "content") else m.get("content")
        if isinstance(content, str):
            parts.append(content)
        else:
            parts.extend(c.get("text", "") for c in content or [] if isinstance(c, dict))
    return "\n".join(parts)


def test_e2b_executor_runs_code_keeps_state_and_returns_the_final_answer(e2b_server: str) -> None:
    executor = E2BExecutor(additional_imports=[], logger=AgentLogger(level=LogLevel.OFF), timeout=300)
    try:
        out = executor("x = 6 * 7\nprint('computed in', __import__('socket').gethostname())\nx")
        assert out.output == "42" and not out.is_final_answer, out
        assert out.logs.startswith("computed in "), out.logs
        # State lives on in the kernel; the file is in the sandbox, which the
        # SDK's commands see too.
        out = executor("open('/tmp/from-smolagents', 'w').write(str(x + 1))\nx + 1")
        assert out.output == "43", out
        assert executor.sandbox.commands.run("cat /tmp/from-smolagents").stdout == "43"
        with pytest.raises(AgentError) as e:
            executor("1 / 0")
        assert "ZeroDivisionError" in str(e.value)
        # smolagents' final_answer, patched to raise inside the kernel.
        executor.send_tools({"final_answer": FinalAnswerTool()})
        out = executor("final_answer({'x': x, 'ok': True})")
        assert out.is_final_answer and out.output == {"x": 42, "ok": True}, out
    finally:
        executor.cleanup()


def test_code_agent_steps_run_on_corral_with_state_between_steps(e2b_server: str) -> None:
    model = ScriptedModel([
        "Thought: I make the numbers and look at them.\n"
        "<code>\nnumbers = [3, 4, 5]\nprint('sum is', sum(numbers))\n</code>",
        "Thought: numbers is still defined; I square them and answer.\n"
        "<code>\ntotal = sum(n * n for n in numbers)\nfinal_answer(total)\n</code>",
    ])
    agent = CodeAgent(
        tools=[],
        model=model,
        executor_type="e2b",
        executor_kwargs={"timeout": 300},
        max_steps=4,
        verbosity_level=LogLevel.OFF,
    )
    try:
        answer = agent.run("Sum the squares of 3, 4 and 5.")
        assert answer == 50, answer
        assert model.replies == [], "every scripted step ran"
        # The first step's output came back from the sandbox as the
        # observation the model saw before its second step.
        assert "sum is 12" in prompt_text(model.prompts[1]), prompt_text(model.prompts[1])[-2000:]
        sandbox = agent.python_executor.sandbox
        assert sandbox.run_code("numbers, total").text == "([3, 4, 5], 50)"
    finally:
        agent.cleanup()
