"""Decoder Lab: train or load a small GPT-style model and watch what it computes.

Run locally with `python app.py` (http://127.0.0.1:7860) or as a Hugging Face Space. This file
assembles the page from its tabs, each laid out and bound to its handlers by a ui/*_tab.py, and
launches it. The handlers live in ui/ too (one module per tab): each checks its inputs, calls one
verb of the person's `lab.session.Session`, draws with one `viz` function and returns it.
"""

from __future__ import annotations

import ui.common  # noqa: F401 - first: ZeroGPU's `spaces` must be imported before torch

import argparse
import logging
import os
from pathlib import Path

import gradio as gr
import torch
from starlette.middleware import Middleware

from lab.catalogue.external import BACKENDS, ENV_VAR, EXTERNAL, SEPARATOR, sources_from
from lab.catalogue.models import DEFAULT_MODEL
from lab.limits import (
    QUEUE_SIZE,
    SESSION_CAPACITY, STATE_TTL_S, UPLOAD_MAX_MB,
)
from lab.server import files
from lab.server.sessionstore import SessionKey
from lab.server.warm import map_large_blocks
from lab.session import SESSIONS, Session
from ui.circuits_reopen import bind_reopen
from ui.circuits_tab import bind_circuits_api, bind_circuits_tab, build_circuits_tab
from ui import diagnose
from ui.common import LATEX, RAW
from ui.explore import (
    attention_figure, generate, probs_figure, redraw, reset, select_model, step, step_picture, undo,
)
from ui.explore_tab import bind_token_view, build_explore_tab
from ui.http import RefuseMalformedCalls
from ui.inside_api import bind_inside_api
from ui.inside_tab import bind_inside_section
from ui.lanes import assign as assign_lanes
from ui.patch_api import bind_patch_api
from ui.pairs import bind_pair_helper
from ui.patching import bind_patching
from ui.positional import positional
from ui.positional_tab import bind_positional_tab, build_positional_tab
from ui.share import page_load
from ui.mcp import mcp_lifespan, quiet_state_warning
from ui.tools import FIRST_TOOLS, bind_tools_api
from ui.train import stop_training, train_model, upload_model
from ui.film_tab import build_film_section
from ui.train_tab import build_train_tab

__all__ = [  # the handlers, importable from here as the API names them (tests and benchmarks call them)
    "attention_figure", "build_demo", "generate", "main", "positional", "probs_figure", "redraw", "reset",
    "select_model", "step", "step_picture", "stop_training", "train_model", "undo", "upload_model",
]

torch.set_num_threads(int(os.environ.get("DECODER_LAB_THREADS", "1")))  # one thread per request: bench/RESULTS.md
ASSETS = Path(__file__).resolve().parent / "assets"
LEARN_PATH = ASSETS / "learn.md"


def build_demo() -> gr.Blocks:
    first = Session()
    first.entry_for(DEFAULT_MODEL)  # loads the default model: a damaged asset fails at start-up
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")  # nothing leaves the machine
    with gr.Blocks(title="Decoder Lab", delete_cache=(600, 3600), analytics_enabled=False, fill_width=True) as demo:
        # A tab's state is only the key of its session in the server's store (ui/common.py `handler`
        # trades it for the session); when gradio deletes the state, the session is closed.
        ses = gr.State(SessionKey(SESSIONS), time_to_live=STATE_TTL_S, delete_callback=SessionKey.close)
        gr.Markdown("**Decoder Lab**: a small GPT-style transformer you can step through, one token at a time.",
                    elem_id="header")
        # a link's `tab` and a session file select a tab by these ids (lab.links.TABS)
        with gr.Tabs(elem_id="tabs") as tabs:
            with gr.Tab("Explore", id="explore") as explore_tab:
                explore = build_explore_tab(ses, first)
                model_dd = explore["model"]

            with gr.Tab("Positional encoding", id="positional") as pe_tab:
                pe_outputs = build_positional_tab()

            with gr.Tab("Circuits", id="circuits") as circuits_tab:
                circuits_ui = build_circuits_tab()  # binds nothing here: its events come after the others

            with gr.Tab("Train", id="train") as train_tab:
                build_train_tab(ses, model_dd)
                build_film_section(ses, model_dd, first, train_tab)

            with gr.Tab("Learn", id="learn") as learn_tab:
                gr.Markdown(LEARN_PATH.read_text(encoding="utf-8"), latex_delimiters=LATEX)

        # The page tells the server its window size once, so that figures are laid out for it.
        # Then a link's parameters (?model=…&prompt=…&steps=…) set the page up (ui/share.py).
        loaded = demo.load(page_load, explore["display_inputs"], explore["state_outputs"], api_name=False,
                           js="(...args) => { args[3] = `${window.innerWidth}x${window.innerHeight}`; return args; }",
                           **RAW)
        bind_positional_tab(ses, model_dd, pe_tab, pe_outputs)  # last: the API page's order and fn_index numbers
        bind_inside_api(ses)  # endpoints added since go after it, so the earlier ones keep their numbers
        bind_patch_api(ses)
        bind_tools_api(demo, FIRST_TOOLS)  # the stateless tools, /tool_<name> (and MCP's tools with --mcp)
        bind_circuits_api(ses)  # /dla, /composition, /circuits, /atp
        bind_tools_api(demo)  # the Circuits view's tools, /tool_dla … /tool_atp: after /atp, so no number moves
        bind_inside_section(ses, explore["inside"])  # page-only events: after every endpoint
        bind_patching(ses, explore["heads"])  # page-only events too
        bind_pair_helper(ses, explore["heads"])  # page-only: which words keep the token count
        bind_token_view(ses, explore["token_view"])  # page-only too: a token clicked, the lines view
        bind_circuits_tab(ses, circuits_ui, model_dd, explore["inside"])  # page-only: its buttons; DLA → Inside too
        # page-only: a link's load and an opened file reopen the Circuits tab, in events chained after theirs
        bind_reopen(demo, ses, circuits_ui, tabs, {"explore": explore_tab, "positional": pe_tab,
                                                   "circuits": circuits_tab, "train": train_tab, "learn": learn_tab},
                    loaded)
    assign_lanes(demo)  # every queued event in its lane of workers (ui/lanes.py; per address: ui/door.py)
    return demo


MCP_ENV_VAR = "DECODER_LAB_MCP"  # "1": serve the stateless tools over MCP too (a Space's variable)


def arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python app.py", description="Decoder Lab: step through a small GPT-style model in the browser.",
        epilog=f"{ENV_VAR} adds models too: several SRC separated by '{SEPARATOR}'. Hub models are read from "
               f"the local Hugging Face cache; nothing is downloaded while the app runs. {MCP_ENV_VAR}=1 is --mcp.")
    parser.add_argument("--model", action="append", default=[], metavar="SRC",
                        help="add a model to the list (repeatable): a Hugging Face model folder, a nanoGPT "
                             "ckpt.pt (its meta.pkl beside it), a Decoder Lab .safetensors file (with its film, "
                             "if it has one), or a hub repo id pinned as owner/name@revision")
    parser.add_argument("--backend", choices=BACKENDS, default="own",
                        help="what runs the --model sources: the own engine (default: every tool, exact, for "
                             "models up to about 1B parameters) or nnsight (a Hugging Face model, local or on "
                             "NDIF: the Explore tools only, a forward per action; docs/models.md)")
    parser.add_argument("--device-map", metavar="MAP", default=None,
                        help="with --backend nnsight: spread the model over this machine's GPUs and CPU "
                             "(transformers' device_map, e.g. auto; needs accelerate)")
    parser.add_argument("--remote", action="store_true",
                        help="with --backend nnsight: run the --model repo ids (owner/name) on NDIF, with the key "
                             "in the environment variable NDIF_API_KEY (never logged or shown)")
    parser.add_argument("--mcp", action="store_true",
                        help="also serve the stateless tools as MCP tools at /gradio_api/mcp/ (off by default: "
                             "a public app would answer agents' calls too; docs/api.md)")
    return parser


def parse_args(argv: list[str] | None = None) -> list:
    """The models the person running the app adds (--model, then the environment variable)."""
    parser = arg_parser()
    args = parser.parse_args(argv)
    try:
        return sources_from(args.model, os.environ.get(ENV_VAR), backend=args.backend, device_map=args.device_map,
                            remote=args.remote)
    except ValueError as exc:  # a source no model can be read from: one line, exit status 2
        parser.exit(2, f"{parser.prog}: error: {exc}\n")


def serves_mcp(argv: list[str] | None = None) -> bool | None:
    """True when asked to serve MCP (--mcp or DECODER_LAB_MCP=1); else None, which leaves it to gradio's own
    GRADIO_MCP_SERVER (off unless set)."""
    return True if arg_parser().parse_args(argv).mcp or os.environ.get(MCP_ENV_VAR, "") == "1" else None


def main(argv: list[str] | None = None) -> None:
    EXTERNAL.configure(parse_args(argv))  # loaded on first use, not here
    mcp = serves_mcp(argv)
    map_large_blocks()  # memory that cooled texts free goes back to the system (lab/server/warm.py)
    logging.basicConfig(level=logging.INFO)
    for chatty in ("httpx", "httpcore", "urllib3"):  # one line per request of gradio's own start-up checks
        logging.getLogger(chatty).setLevel(logging.WARNING)
    files.sweep_runs()
    diagnose.install()  # `kill -USR1 <pid>`: the queue, the door and every thread's stack, in the log
    demo = build_demo()
    quiet_state_warning()  # the MCP server, if any, serves the stateless tools only (ui/mcp.py)
    # gradio summarises its last 10,000 calls with pandas after every call, for the monitoring page this
    # app turns off: ~14 ms of CPU each, which one address's flood made every visitor's call pay
    os.environ.setdefault("GRADIO_ANALYTICS_CACHE_FREQUENCY", str(2**31))
    os.environ.setdefault("GRADIO_ANALYTICS_MAX_EVENTS", "100")
    demo.queue(max_size=QUEUE_SIZE)
    demo.launch(max_file_size=f"{UPLOAD_MAX_MB}mb", show_error=False, enable_monitoring=False,
                state_session_capacity=SESSION_CAPACITY, ssr_mode=False, footer_links=[],
                run_history=False,  # nothing to record (its optional Hub bucket would need the network)
                css=(ASSETS / "explore.css").read_text(encoding="utf-8"),
                js=(ASSETS / "explore.js").read_text(encoding="utf-8"), allowed_paths=[str(files.RUNS)],
                mcp_server=mcp,  # the stateless tools as MCP tools (ui/tools.py); off unless asked for
                app_kwargs={"middleware": [Middleware(RefuseMalformedCalls, blocks=demo)],
                            "lifespan": mcp_lifespan(demo)})


if __name__ == "__main__":
    main()
