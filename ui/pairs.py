"""Compare A / B's helper for making a minimal pair on any model: a template with a slot and some words; it
says how many tokens the prompt has with each word (lab.pairs.count_tokens), grouped, so that two words of
one group make a pair whose prompts patching can swap position by position.

Laid out inside the Compare tab (`lay_out_pair_helper`); its event is page-only, bound after every endpoint
(`bind_pair_helper`, from app.py), so the endpoints keep their numbers.
"""

from __future__ import annotations

import html
from types import SimpleNamespace

import gradio as gr

from lab.pairs import SLOT, count_report, count_tokens

from .common import RAW, handler, known_model

HELP = (f"Type a sentence with {SLOT} where a word goes, and words to try there. Each word's prompt is counted "
        "in this model's tokens: two words of one group give prompts of the same length, which patching needs "
        "(and an answer is best one token: try it as a word here too).")


def lay_out_pair_helper(h: SimpleNamespace) -> None:
    """The helper's components (call inside the Compare A / B tab)."""
    with gr.Accordion("Which words keep the token count (make a pair for this model)", open=False,
                      elem_id="pair_helper"):
        gr.Markdown(HELP, elem_classes="lab-intro")
        with gr.Row(equal_height=True):
            h.pair_template = gr.Textbox(f"The capital of {SLOT} is", label="Template", elem_id="pair_template",
                                         scale=3, min_width=200, max_length=300)
            h.pair_words = gr.Textbox("France, Italy, Japan, Germany, Spain", label="Words (separated by commas)",
                                      elem_id="pair_words", scale=3, min_width=200, max_length=2000)
            h.pair_count = gr.Button("Count tokens", elem_id="pair_count", scale=0, min_width=130)
        h.pair_counts = gr.Markdown("", elem_id="pair_counts")


@handler(exclusive=False)
def count_pair_words(session, model_name, template, words, request: gr.Request = None):
    """The words' token counts in the template, for the model shown (lab.pairs)."""
    entry = session.entry_for(known_model(session, model_name))
    report = count_report(count_tokens(entry, template, words))
    return f"**{html.escape(entry.name, quote=False)}**:\n\n{report}"


def bind_pair_helper(ses: gr.State, h: SimpleNamespace) -> None:
    inputs = [ses, h.ex["model"], h.pair_template, h.pair_words]
    for trigger in (h.pair_count.click, h.pair_words.submit, h.pair_template.submit):
        trigger(count_pair_words, inputs, h.pair_counts, api_name=False, show_progress="hidden", **RAW)
