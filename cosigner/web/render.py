"""Jinja2 rendering: autoescape on for every template, whatever its name."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import HTMLResponse

if TYPE_CHECKING:
    from jinja2 import Environment

TEMPLATES = Path(__file__).parent / "templates"


@lru_cache(maxsize=1)
def environment() -> Environment:
    """The template environment, made (and Jinja2 imported) when the first page renders."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    return Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True,
                       undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def page(request: Request, template: str, *, status: int = 200, **context: Any) -> HTMLResponse:
    """Render ``template`` with ``context`` (plus ``user`` and ``csrf`` when signed in)."""
    context.setdefault("user", getattr(request.state, "web_user", None))
    context.setdefault("csrf", getattr(request.state, "web_csrf", ""))
    context.setdefault("message", None)
    html = environment().get_template(template).render(**context)
    return HTMLResponse(html, status_code=status)
