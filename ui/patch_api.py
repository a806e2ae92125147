"""The API's /patch: an activation-patching sweep between two prompts, as numbers (`session.sweeps`, lab.sweeps).

/patch(model_name, prompt_a, prompt_b, metric, answer, other, what, direction): metric "logit_diff"
(logit of `answer` minus logit of `other` at the last position) or "prob" (probability of `answer`;
`other` is ignored); what "heads" (layer × head), "resid", "attn" or "mlp" (layer × position);
direction "denoising" (B's run with one activation of A) or "noising" (A's run with one of B). The
answer is `lab.patching.PatchResult.to_json()`: the heatmap's numbers (`values`, the share of the
A→B difference restored or made; `metric_patched`, the metric of each patched run), m_A, m_B, the
tokens and a one-line summary; the same JSON the sweep's download holds. API-only (hidden button and
JSON), bound after the page's other events (app.py) so the earlier endpoints keep their numbers.
"""

from __future__ import annotations

import gradio as gr

from lab.catalogue.models import DEFAULT_MODEL
from lab.limits import CONCURRENCY

from .common import RAW, api_example, handler

EXAMPLE = (DEFAULT_MODEL, "anna found the key . she gave it to tom because he asked",
           "tom found the key . he gave it to anna because she asked", "logit_diff", " she", " he", "heads",
           "denoising")


@handler(rate="patch")
def patch(session, model_name, prompt_a, prompt_b, metric, answer, other=None, what="heads", direction="denoising",
          request: gr.Request = None):
    """Patch every cell of one sweep from one prompt's run into the other's; the heatmap's numbers as JSON."""
    return session.sweeps.run(model_name, prompt_a, prompt_b, metric, answer, other, what, direction).to_json()


def bind_patch_api(ses: gr.State) -> None:
    """The hidden components and the event of /patch (call inside the page's Blocks, after the other events)."""
    boxes = [gr.Textbox(visible=False) for _ in EXAMPLE]
    for box, example in zip(boxes, EXAMPLE):
        api_example(box, example)
    answer = gr.JSON(visible=False)
    gr.Button(visible=False).click(patch, [ses, *boxes], answer, api_name="patch",
                                   concurrency_limit=CONCURRENCY["patch"], concurrency_id="patch", **RAW)
