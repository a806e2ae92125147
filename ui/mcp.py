"""The MCP server of `python app.py --mcp` (or DECODER_LAB_MCP=1): gradio's own, fitted to the stateless tools.

Gradio's MCP server (gradio/mcp.py) would serve every endpoint of the page as a tool, and the page's act on
a session an MCP call does not have (gradio warns of that: such a tool gets an empty session every time).
`mcp_lifespan` fits it at start-up: only the tools of ui/tools.py, by their plain names; a refusal as its
sentence (a call refused at the door reaches gradio's MCP server as an HTTP status, a handler's as
HTML-escaped text); answers as JSON text.
"""

import contextlib
import html
import json
import warnings

import gradio as gr
import httpx
from gradio_client.exceptions import AppError

from .tools import ENDPOINT_PREFIX, ENDPOINTS


ERROR_TITLE = "Error: "  # how gradio's MCP server words a handler's refusal when the client asked for progress


class ToolRefused(Exception):
    """A tool call refused, with the sentence an MCP client shows (the MCP server sends str() as the error)."""


def _sentence(exc: Exception) -> Exception:
    """What a refused call raised, as the refusal's plain sentence (anything else as it was)."""
    if isinstance(exc, httpx.HTTPStatusError):  # refused at the door: its JSON says why
        try:
            said = exc.response.json().get("error")
        except (ValueError, AttributeError):
            said = None
        return ToolRefused(said) if isinstance(said, str) and said else exc
    if isinstance(exc, AppError):  # the handler's sentence, escaped for the page's HTML
        return ToolRefused(html.unescape(str(exc)))
    if isinstance(exc, RuntimeError) and str(exc).startswith(ERROR_TITLE):  # the same, on the way with progress
        return ToolRefused(html.unescape(str(exc)[len(ERROR_TITLE):]))
    return exc


def _as_json(outputs: list) -> list:
    return [json.dumps(o, ensure_ascii=False) if isinstance(o, (dict, list)) else o for o in outputs]


def _plain(execute):
    """One of the MCP server's ways to run a call: refusals as their sentence, answers as JSON text."""
    async def run(*args, **kwargs):
        try:
            return _as_json(await execute(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - every error is raised again, a refusal as its sentence
            raise _sentence(exc) from None
    return run


def fit_mcp_server(server) -> None:
    """Gradio's MCP server (gradio.mcp.GradioMCPServer) serving these tools only, by their plain names."""
    bound = {f.api_name for f in server.blocks.fns.values()}
    server.tool_to_endpoint = {server.tool_prefix + name: "/" + ENDPOINT_PREFIX + name for name in ENDPOINTS
                               if ENDPOINT_PREFIX + name in bound}
    server._execute_tool_without_progress = _plain(server._execute_tool_without_progress)
    server._execute_tool_with_progress = _plain(server._execute_tool_with_progress)


def mcp_lifespan(blocks: gr.Blocks):
    """The app's lifespan (launch's app_kwargs): at start-up, before any request, the MCP server (when
    there is one) is fitted (`fit_mcp_server`)."""
    @contextlib.asynccontextmanager
    async def lifespan(app):
        if blocks.mcp_server_obj is not None:
            fit_mcp_server(blocks.mcp_server_obj)
        yield
    return lifespan


def quiet_state_warning() -> None:
    """Gradio warns when it makes an MCP server whose endpoints take a gr.State (the page's do); those are
    left out of it at start-up (`fit_mcp_server`), so the warning would say what is not so."""
    warnings.filterwarnings("ignore", message="This MCP server includes a tool that has a gr.State input")
