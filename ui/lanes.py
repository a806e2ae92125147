"""The lanes of the server's queue: which events share workers, and how many of them run at once.

Every queued event of the page is in one lane, named here by its handler. A lane is one of gradio's
concurrency groups, at most `lab.limits.CONCURRENCY[lane]` calls of it running at once, in the order
they joined. The door (ui/door.py) lets one address have at most `CLIENT_WORKERS` calls in the queue
(its training besides), so another visitor's call waits behind at most that many of each other
address's, and only in its own lane. The lanes keep what costs little and is pressed often (Step,
Undo, a view redrawn) apart from what costs more:

- explore: Step, Undo, Reset, another model, a view redrawn, a token selected, the sampling's bars;
- generate: Generate, which streams up to 256 tokens (and the API's stateless generate, ui/tools.py);
- tools: the head tools, Inside one cell and its matrices, Compare, Regenerate, the lens, the
  positional encodings (each works through a whole text), and the stateless tools that read a prompt;
- film: the training film's frames;
- export: files made (session files, numbers, web pages, links);
- page: a page loaded (a link's steps too: a replay);
- replay: a session file opened (never behind another address's: up to `CONCURRENCY["replay"]` at once);
- upload, train, patch: a model uploaded, a training, a patching sweep (the page's, the API's, the stateless tool's),
  and the Circuits tab's long jobs (head composition, attribution patching);
- tools also has the Circuits tab's direct logit attribution and one head's circuits.

app.py calls `assign` once the page is built, before gradio's queue starts; the tab modules' own
groups are the defaults it replaces.
"""

from __future__ import annotations

from lab.limits import CONCURRENCY

LANES: dict[str, tuple[str, ...]] = {
    "explore": ("step_picture", "step", "undo", "reset", "redraw_view", "select_token", "lines_from_token", "resample",
                "select_model", "shift_head", "set_display", "tool_models"),
    "generate": ("generate", "tool_generate"),
    "tools": ("refresh", "show_tool", "ablate", "edit_attention", "clear_settings", "regenerate", "head_roles_table",
              "lens_at", "compare", "inside", "open_patched_head", "pick_head", "model_changed", "open_panel",
              "_matrices_if_open", "selected_token", "pick_cell", "draw_matrices", "colour_caption", "positional",
              "count_pair_words", "tool_attention", "tool_head_roles", "tool_logit_lens", "tool_ablate",
              "tool_inside_cell", "dla_api", "show_dla", "circuits_api", "show_circuits", "composition_kind",
              "tool_dla", "tool_head_circuits", "open_dla_head", "inside_for_head", "open_pair"),
    "film": ("show_film", "redraw_film", "next_frame", "open_film", "follow_model", "film_choices"),
    "export": ("save_session", "make_link", "save_view_page", "export_numbers", "download_cell", "download_patching",
               "save_film_page", "download_circuits"),
    "page": ("page_load",),
    "replay": ("open_session",),
    "upload": ("upload_model",),
    "train": ("train_model",),
    "patch": ("patch", "run_patching", "tool_patch", "composition_api", "run_composition", "atp_api", "run_atp",
              "tool_composition", "tool_atp"),
}
LANE_OF = {name: lane for lane, names in LANES.items() for name in names}


def handler_name(fn) -> str | None:
    """The name of the handler a block function runs (None for an event with JavaScript only)."""
    return getattr(getattr(fn, "fn", None), "__name__", None)


def assign(blocks) -> list[str]:
    """Put every queued event of `blocks` in its lane (gradio's concurrency group and limit); returns the
    names of queued handlers that no lane names (kept in their own group: tests/ui/test_lanes.py keeps
    this list empty)."""
    unplaced = []
    for fn in blocks.fns.values():
        name = handler_name(fn)
        if not fn.queue or name is None:
            continue
        lane = LANE_OF.get(name)
        if lane is None:
            unplaced.append(name)
            continue
        fn.concurrency_id, fn.concurrency_limit = lane, CONCURRENCY[lane]
    return unplaced
