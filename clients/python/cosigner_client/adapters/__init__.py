"""Framework adapters: each maps Cosigner's three gates onto a framework's own tool and
human-in-the-loop mechanism. Import the one you use (each needs its framework installed):

* ``cosigner_client.adapters.openai_agents`` — OpenAI Agents SDK (``needs_approval``,
  ``RunState`` interruptions);
* ``cosigner_client.adapters.langgraph`` — LangGraph (a tool node that ``interrupt()``s);
* ``cosigner_client.adapters.pydantic_ai`` — Pydantic AI deferred tools;
* ``cosigner_client.adapters.decorator`` — a framework-free ``@cosigned`` decorator;
* ``cosigner_client.adapters.results`` — Anthropic ``tool_result`` / OpenAI tool output.
"""
