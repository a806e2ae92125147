"""The API's /inside: one attention cell of the Explore text worked through, as JSON (lab.inside).

/inside(layer, head, query, key): query and key are window positions; None (or an empty value)
takes the selected token as the query and, as the key, the one it gives the largest share. The
answer holds every number of the cell with its formula (see lab.inside.cell). The endpoint is
API-only (a hidden button and a hidden JSON), bound after the page's other events (app.py) so the
other endpoints keep their numbers.
"""

from __future__ import annotations

import gradio as gr

from lab.limits import CONCURRENCY

from .common import RAW, api_example, handler


def _optional(value):
    """An absent position: None or an empty string (a cleared number box)."""
    return None if value is None or (isinstance(value, str) and not value.strip()) else value


@handler
def inside(session, layer, head, query=None, key=None, request: gr.Request = None):
    """Cell (query, key) of head `head` in `layer`: every number from x_i to the residual, with its formula."""
    return session.inside.cell(layer, head, _optional(query), _optional(key))


def bind_inside_api(ses: gr.State) -> None:
    """The hidden components and the event of /inside (call inside the page's Blocks, after the other events)."""
    layer, head = gr.Number(0, visible=False, precision=0), gr.Number(0, visible=False, precision=0)
    query, key = gr.Number(None, visible=False, precision=0), gr.Number(None, visible=False, precision=0)
    for box, example in ((layer, 0), (head, 0), (query, 0), (key, 0)):
        api_example(box, example)
    answer = gr.JSON(visible=False)
    gr.Button(visible=False).click(inside, [ses, layer, head, query, key], answer, api_name="inside",
                                   concurrency_limit=CONCURRENCY["explore"], concurrency_id="explore", **RAW)
