"""The Patching part of the Compare A / B tab: activation patching between prompt A and prompt B.

The learner chooses a metric (the logit difference of two answer tokens, or the probability of one),
a direction (denoising: A's activations into B's run; noising: B's into A's) and what to patch (each
head's output, or each layer's residual stream, attention output or MLP output at each position).
Run streams a progress bar and Stop ends the sweep after its current batch (lab.sweeps). The
result is a heatmap of the share of the difference each patch restores (viz.patching) with a
one-line summary of the best cells. A click on a head's cell opens that head: the Explore attention
shows it, Compare A / B draws its layer's B − A with the head named, and a figure shows its attention
on both prompts side by side.

The layout is made inside the Compare tab (`lay_out_patching`); the events are bound by app.py
after the page's other events (`bind_patching`), so the API's endpoint numbers stay as they were.
"""

from __future__ import annotations

import html
import time
from types import SimpleNamespace

import gradio as gr
import numpy as np

from lab import patching
from lab.checks import UserError, check_choice, check_text, whole_numbers
from lab.export import model_stem
from lab.limits import CONCURRENCY
from lab.pairs import answers_of, pairs_for as made_pairs
from viz.patching import head_on_two_prompts, patching_map

from .common import RAW, handler, message_plot, named
from .heads import compare_views, width_for
from .plots import to_plot

PATCH_INTRO = (
    "**Activation patching** asks which parts of the model carry the difference between A and B. Prompt A is "
    "the *clean* run, B the *corrupted* one (same number of tokens). Each cell of the map is one more forward "
    "pass with one activation copied from one run into the other; its number is the share of the difference "
    "in the metric that this one copy moves (0 = nothing, 1 = all of it). Details in the Learn tab.")
DIRECTION_LABELS = {"denoising": "denoising: A into B", "noising": "noising: B into A"}
METRIC_LABELS = {"logit_diff": "logit difference", "prob": "probability"}
NO_SWEEP = "Choose the answer tokens and press Run patching."
NO_HEAD = "Click a head's cell in the map above to see its attention on both prompts."
NO_HEAD_HERE = "A cell of this map is a layer at a position: run a sweep of the head outputs to open a head."
SHOW_BEST = 3  # cells named in the summary (and outlined, from the second on only where they move BEST_SHARE)
BEST_SHARE = 0.1
DEFAULT_ANSWERS = {"grammar (built-in)": ("her", "him")}  # the first grammar pair continues with her / him
# The answer tokens that tell the minimal pairs' continuations apart (ui/heads.py PAIRS), A's first.
PAIR_ANSWERS = {
    ("anna found the key . she gave it to tom because he asked",
     "tom found the key . he gave it to anna because she asked"): ("her", "him"),
    ("tom found the key . he gave it to anna because", "anna found the key . she gave it to tom because"): ("she", "he"),
}

def direction_help() -> str:
    """One line per direction: what it runs and what its 1 means (lab.patching.DIRECTIONS)."""
    return "  \n".join(f"**{d.capitalize()}**, {html.escape(patching.DIRECTIONS[d], quote=False)}"
                       for d in patching.DIRECTIONS)


def lay_out_patching(h: SimpleNamespace, default_model: str) -> None:
    """The Patching part's components (call inside the Compare A / B tab, under the comparison)."""
    answer, other = DEFAULT_ANSWERS.get(default_model, ("", ""))
    # the id on a Column: gradio 6 gives a Group's id to two nested elements of the page
    with gr.Column(elem_id="patching"), gr.Group():
        gr.Markdown(PATCH_INTRO, elem_classes="lab-intro")
        with gr.Row(equal_height=True):
            h.patch_metric = gr.Radio([(METRIC_LABELS[m], m) for m in patching.METRICS], value="logit_diff",
                                      label="Metric at the last position", elem_id="patch_metric", scale=2,
                                      min_width=200)
            h.patch_answer = gr.Textbox(answer, label="Answer token", elem_id="patch_answer", scale=1, min_width=110)
            h.patch_other = gr.Textbox(other, label="minus the logit of", elem_id="patch_other", scale=1,
                                       min_width=110)
            h.patch_direction = gr.Radio([(DIRECTION_LABELS[d], d) for d in patching.DIRECTIONS], value="denoising",
                                         label="Direction", elem_id="patch_direction", scale=2, min_width=200)
            h.patch_what = gr.Dropdown([(label, key) for key, label in patching.SWEEPS.items()], value="heads",
                                       label="What to patch", elem_id="patch_what", scale=2, min_width=180)
        gr.Markdown(direction_help(), elem_id="patch_directions", elem_classes="lab-intro")
        with gr.Row(equal_height=True):
            h.patch_run = gr.Button("Run patching", variant="primary", elem_id="patch_run", scale=0, min_width=160)
            h.patch_stop = gr.Button("Stop", variant="stop", elem_id="patch_stop", scale=0, min_width=90)
            with gr.Column(scale=4, min_width=200):
                h.patch_progress = gr.HTML(sweep_progress_html(None), elem_id="patch_progress")
        h.patch_note = gr.Markdown("", elem_id="patch_note")
        h.patch_plot = gr.Plot(message_plot(NO_SWEEP), show_label=False, elem_id="patch_map")
        with gr.Accordion("Download the map's numbers", open=False, elem_id="patch_numbers"), gr.Row():
            h.patch_fmt = gr.Radio(["csv", "json"], value="csv", label="One line per cell, as", elem_id="patch_fmt",
                                   scale=1, min_width=160)
            h.patch_download = gr.Button("Download", elem_id="patch_download", scale=0, min_width=120)
            h.patch_file = gr.File(label="Numbers", elem_id="patch_file", interactive=False, height=90, scale=2)
        h.patch_head_plot = gr.Plot(message_plot(NO_HEAD), show_label=False, elem_id="patch_head")
        h.patch_pick_value = gr.Textbox(visible=False)
        h.patch_pick_btn = gr.Button("pick", elem_id="patch_pick", elem_classes="lab-hidden")
        h.patch_json = gr.JSON(visible=False)


def sweep_progress_html(done: int | None, total: int = 1, text: str = "") -> str:
    """A progress bar of the sweep's cells (an empty one before the first sweep)."""
    done = 0 if done is None else done
    total = max(1, total)
    text = text or ("No sweep yet." if done == 0 else f"{done} / {total} patched runs")
    return ('<div class="patch-progress" style="display:flex;flex-direction:column;gap:2px">'
            f'<progress value="{done}" max="{total}" aria-label="patching progress" style="width:100%;height:14px">'
            f'{100 * done / total:.0f}%</progress>'
            f'<span style="font-size:var(--text-sm)">{html.escape(text)}</span></div>')


def metric_note(result: patching.PatchResult) -> str:
    """The metric on A and on B, what the colours mean, and the summary of the best cells."""
    s = result.setup
    label = html.escape(s.metric.label, quote=False)
    lines = [f"**{label}**: {s.clean:.3f} on A, {s.corrupted:.3f} on B (difference {s.difference:+.3f}).",
             *(f"⚠ **{html.escape(c, quote=False)}**" for c in result.cautions()),
             f"**{html.escape(best_line(result), quote=False)}**"]
    if result.stopped:
        lines.append(f"Stopped after {result.done} of {result.values.size} patched runs: the dashed cells were "
                     "not computed.")
    lines += [html.escape(n, quote=False) for n in s.notes]
    return "  \n".join(lines)


def best_line(result: patching.PatchResult) -> str:
    """The summary of the best cell, then the next best ones with their shares."""
    line = result.summary()
    rest = result.best(SHOW_BEST)[1:]
    if rest:
        line += "; then " + ", ".join(f"{result.cell_name(r, c)} {100 * v:.0f} %" for r, c, v in rest)
    return line


def best_cells(result: patching.PatchResult) -> list[tuple[int, int]]:
    """The cells outlined as the best: the best one, and the next ones while they move a tenth or more."""
    top = result.best(SHOW_BEST)
    return [(r, c) for k, (r, c, v) in enumerate(top) if k == 0 or v >= BEST_SHARE]


def sweep_ends(direction: str) -> tuple[str, str]:
    """What the metric equals at share 0 and at share 1: B's run and A's when denoising, A's and B's when noising."""
    return ("B", "A") if direction == "denoising" else ("A", "B")


def map_caution(result: patching.PatchResult) -> str | None:
    """The map's own warning (it travels with a downloaded PNG), short: the note above it has the numbers."""
    said = ["has the wrong sign"] if result.wrong_sign() else []
    if result.small_difference():
        low, high = result.spread()
        said.append(f"is small next to the patched runs' spread ({high - low:.3f}): read these shares as noise")
    return f"The A/B difference ({result.setup.difference:+.3f}) " + " and ".join(said) if said else None


def patch_figure(session, result: patching.PatchResult, selected: tuple[int, int] | None = None):
    """The sweep's heatmap for the page."""
    s = result.setup
    heads = result.what == "heads"
    what = patching.SWEEPS[result.what].split(" (")[0]
    direction = DIRECTION_LABELS[result.direction]
    title = (f"{direction[0].upper()}{direction[1:]} · {what}: "
             f"{result.value_name.replace('A→B', s.metric.difference_name)}")
    fig = patching_map(result.values, kind="heads" if heads else "positions",
                       columns=None if heads else s.aligned_tokens(), rows=result.rows, metric=result.metric,
                       ends=sweep_ends(result.direction), best=best_cells(result),
                       selected=selected, title=title, caution=map_caution(result),
                       presentation=session.display.presentation,
                       width_px=width_for(session), scale_title=f"share {result.value_name.split()[-1]}")
    return to_plot(named(fig, model_stem(s.entry.name), "patching", result.what, result.direction))


# ------------------------------------------------------------------------------ handlers


@handler(rate="patch")
def run_patching(session, model_name, prompt_a, prompt_b, metric, answer, other, what, direction,
                 request: gr.Request = None):
    """Run one sweep, streaming its progress; ends with the heatmap, the metric line and the summary."""
    last = 0.0
    # the sweep's result stays on the session (`session.sweeps.last`) for the map's clicks and download
    for p in session.sweeps.run_steps(model_name, prompt_a, prompt_b, metric, answer, other, what, direction):
        if p.result is not None:
            r = p.result
            text = (f"stopped: {r.done} / {p.total} patched runs" if r.stopped
                    else f"{p.total} / {p.total} patched runs")
            yield (sweep_progress_html(r.done, p.total, text), metric_note(r), patch_figure(session, r),
                   message_plot(NO_HEAD if r.what == "heads" else NO_HEAD_HERE), r.to_json())
        elif time.perf_counter() - last > 0.25:
            last = time.perf_counter()
            yield sweep_progress_html(p.done, p.total), gr.skip(), gr.skip(), gr.skip(), gr.skip()


@handler(rate="export")
def download_patching(session, fmt, request: gr.Request = None):
    """The last sweep's numbers, one line per cell (lab.patching.export), as CSV or JSON."""
    if fmt not in ("csv", "json"):
        raise UserError("The format must be csv or json.")
    exp = session.sweeps.export()
    data = exp.csv.encode("utf-8-sig") if fmt == "csv" else exp.json_text().encode("utf-8")
    return str(session.save_file(exp.name, f".{fmt}", data))


@handler(exclusive=False)  # Stop must not wait for the sweep it stops
def stop_patching(session, request: gr.Request = None):
    if not session.sweeps.stop():
        return gr.skip()
    return sweep_progress_html(0, 1, "Stopping after the current batch…")


@handler
def open_patched_head(session, pick, prompt_a, prompt_b, view=None, request: gr.Request = None):
    """A click on a head's cell ("layer,head"): the Explore attention shows that head, Compare A / B draws
    its layer's B − A with the head named, and its attention on both prompts is drawn side by side."""
    result = session.sweeps.last
    cell = whole_numbers(pick, ",", 2)  # "layer,head"
    if result is None or result.what != "heads":
        raise UserError("Run a sweep of the head outputs first, then click one of its cells.")
    if cell is None:
        raise UserError("Click a cell of the patching map.")
    check_text("view", view, optional=True)
    layer, head = cell
    if not (0 <= layer < len(result.rows) and 0 <= head < len(result.columns)):
        raise UserError("Click a cell of the patching map.")
    s = result.setup
    c = session.heads.compare(s.entry.name, prompt_a, prompt_b)
    if c.tokens_a != s.tokens_a or c.tokens_b != s.tokens_b:
        raise UserError("The prompts changed since this sweep: press Run patching again, then click a cell.")
    share = result.values[layer, head]
    noted = f"{100 * share:.0f} % restored" if np.isfinite(share) else "not computed"
    if result.direction == "noising" and np.isfinite(share):
        noted = f"{100 * share:.0f} % made"
    diff, changes, dist, notes, _ = compare_views(session, s.entry.name, c, layer, panel_notes={head: noted})
    pair = head_on_two_prompts(c.weights_a[layer][head], c.weights_b[layer][head], s.aligned_tokens(), layer=layer,
                               head=head, causal=c.causal, width_px=width_for(session),
                               max_height_px=session.display.screen_height, presentation=session.display.presentation,
                               title=f"L{layer}H{head} ({noted}): attention on prompt A and on prompt B")
    stem = model_stem(s.entry.name)
    return (layer, head, "weights" if view == "all layers" else gr.skip(), layer, diff, changes, dist, notes,
            patch_figure(session, result, (layer, head)),
            to_plot(named(pair, stem, "patching", f"L{layer}H{head}", "A-and-B")))


def bind_patching(ses: gr.State, h: SimpleNamespace) -> None:
    """Run, Stop and a click on a head's cell. Page-only events (no API name): app.py binds them after
    every endpoint, so the endpoints keep their numbers; the API's sweep is /patch (ui/patch_api.py)."""
    ex = h.ex
    group = dict(concurrency_limit=CONCURRENCY["patch"], concurrency_id="patch", **RAW)
    inputs = [ses, ex["model"], h.prompt_a, h.prompt_b, h.patch_metric, h.patch_answer, h.patch_other, h.patch_what,
              h.patch_direction]
    h.patch_run.click(run_patching, inputs, [h.patch_progress, h.patch_note, h.patch_plot, h.patch_head_plot,
                                             h.patch_json],
                      api_name=False, show_progress="hidden", **group)
    h.patch_stop.click(stop_patching, ses, h.patch_progress, api_name=False, queue=False, **RAW)
    h.patch_download.click(download_patching, [ses, h.patch_fmt], h.patch_file, api_name=False,
                           show_progress="hidden", **RAW)
    # the page puts "layer,head" in `patch_pick_value` (assets/explore.js)
    h.patch_pick_btn.click(
        open_patched_head, [ses, h.patch_pick_value, h.prompt_a, h.prompt_b, ex["view"]],
        [ex["layer"], ex["head"], ex["view"], h.cmp_layer, h.diff_plot, h.changes_plot, h.dist_plot, h.cmp_notes,
         h.patch_plot, h.patch_head_plot],
        api_name=False, show_progress="hidden",
        js="(...a) => { a[1] = window.decoderLab ? window.decoderLab.patchPick : ''; return a; }",
        **ex["explore_group"]).success(**h.after_change)
    h.pair.input(pair_answers, [ses, ex["model"], h.pair], [h.patch_answer, h.patch_other], api_name=False,
                 queue=False, **RAW)
    h.patch_metric.input(metric_changed, h.patch_metric, h.patch_other, api_name=False, queue=False, **RAW)
    ex["model"].change(model_switched, [ses, ex["model"]], [h.patch_answer, h.patch_other, h.patch_progress,
                                                             h.patch_note, h.patch_plot, h.patch_head_plot],
                       api_name=False, queue=False, **RAW)


@handler(exclusive=False)
def pair_answers(session, model_name, value, request: gr.Request = None):
    """A minimal pair chosen (its menu value, "A␞B"): the answer tokens that tell its continuations apart,
    where they are known (a built-in's pairs, or those lab.pairs made for this model's tokenizer, as its
    pieces); otherwise the boxes stay as they are."""
    if value is not None and not isinstance(value, str):
        raise UserError("Minimal pairs: choose one of the pairs in the list.")
    parts = value.split("\u241e") if isinstance(value, str) else []
    answers = PAIR_ANSWERS.get(tuple(parts)) if len(parts) == 2 else None
    if answers is None and len(parts) == 2 and isinstance(model_name, str) and model_name in session.model_names():
        answers = answers_of(session.entry_for(model_name), *parts)
    return answers if answers is not None else (gr.skip(), gr.skip())


@handler
def metric_changed(metric):
    """The second answer box is used by the logit difference only."""
    return gr.update(interactive=check_choice("metric", metric, patching.METRICS) == "logit_diff")


@handler(exclusive=False)
def model_switched(session, model_name, request: gr.Request = None):
    """Another model: its default answers (a built-in's, or those of the first pair lab.pairs makes for a
    model of one's own, which Compare's prompts then hold), and the last sweep's figures go."""
    if not isinstance(model_name, str):
        raise UserError("The model must be given by its name in the list.")
    answer, other = DEFAULT_ANSWERS.get(model_name, ("", ""))
    entry = session.entry_for(model_name)
    made = made_pairs(entry) if not entry.builtin else []
    if made:
        answer, other = made[0].answer_a, made[0].answer_b
    return answer, other, sweep_progress_html(None), "", message_plot(NO_SWEEP), message_plot(NO_HEAD)
