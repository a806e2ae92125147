"""How one person's figures are drawn: the attention view chosen (`View`) and the page's display
settings (`Display`: colour mode, large fonts, the window's size, the head tool shown).

Both are plain data; `check_view` and `changed_display` check what the page sends before anything
changes, and refuse with a `UserError` a person can read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .catalogue.models import ModelEntry
from .checks import UserError, check_choice, check_int, whole_numbers
from .limits import ATTENTION_VIEWS, COLOUR_MODES

ONE_COLUMN_PX = 700  # a window narrower than this gets the one-column page (phones)
SHORT_PX = 800  # a window lower than this (a projector's 1280×720) hides the page's header line
HEAD_TOOLS = ("roles", "lens", "ablate", "compare")  # the tabs under the Explore text (ui/heads_tab.py)
HEAD_PAGE = 6  # a layer with more heads than this shows them a page at a time ("H6–11" in the Head menu)


@dataclass
class View:
    """Which attention picture to draw: a layer, one head (None = all of the layer's) and a view.
    heads: with head None on a layer of more than HEAD_PAGE heads, the page of heads drawn (None: all)."""

    layer: int
    head: int | None
    view: str
    heads: tuple[int, ...] | None = None

    @property
    def menu_head(self) -> int | str:
        """The Head menu's value for this view (what links and session files carry): a head, "all",
        or a page of heads such as "6-11"."""
        if self.head is not None:
            return self.head
        return "all" if self.heads is None else page_value(self.heads)


@dataclass
class Display:
    """How this person's figures are drawn: the colour mode of attention weights, large fonts for
    projecting, and the size of their browser window (figures are laid out for it)."""

    colour: str = "linear"
    presentation: bool = False
    width: int = 1366
    height: int = 900
    tool: str = "roles"  # the head tool shown under the text (HEAD_TOOLS): only it is drawn at each Step

    @property
    def narrow(self) -> bool:
        return self.width < ONE_COLUMN_PX

    @property
    def plot_width(self) -> int:
        """Width of the attention figure: the left column of the Explore page, the whole page when narrow."""
        return max(260, self.width - 64) if self.narrow else max(480, int(self.width * 0.56))

    @property
    def screen_height(self) -> int:
        """Tallest any figure may be: the window less a margin."""
        return max(320, self.height - 40)

    @property
    def plot_height(self) -> int:
        """Tallest the attention figure may be: what the window leaves below the page's controls."""
        if self.narrow:
            return max(300, min(self.width + 60, self.height - 110))
        large = 30 if self.presentation else 0  # large fonts: a taller caption above the figure
        return max(320, self.height - (385 if self.height > SHORT_PX else 365) - large)  # the header hides when short

    @property
    def chart_height(self) -> int:
        """Tallest the next-token chart may be: what the window leaves below the text and its shading note
        (assets/explore.css keeps the text to a few lines on a short window)."""
        if self.narrow:
            return 360
        return min(360, max(220, self.height - (480 if self.presentation else 455)))


def head_pages(n_heads: int) -> list[tuple[int, ...]]:
    """The pages of heads a layer view shows: one page of every head up to HEAD_PAGE heads, else
    HEAD_PAGE heads at a time (12 heads: 0–5 and 6–11)."""
    return [tuple(range(a, min(a + HEAD_PAGE, n_heads))) for a in range(0, n_heads, HEAD_PAGE)]


def page_value(page: tuple[int, ...]) -> str:
    """What the Head menu sends for a page: "all" for the first (every head when they fit), "6-11"."""
    return "all" if page[0] == 0 else f"{page[0]}-{page[-1]}"


def check_head(head, n_heads: int) -> tuple[int | None, tuple[int, ...] | None]:
    """(head, page) for the Head menu's value: a head number, "all" (the first page) or a page such as
    "6-11"; the page is None where one page holds every head."""
    pages = head_pages(n_heads)
    for page in pages:
        if head == page_value(page):
            return None, page if len(pages) > 1 else None
    return check_int("head", head, 0, n_heads - 1), None


def check_view(entry: ModelEntry, layer, head, view) -> View:
    """The view settings checked against this model ("all" heads = None, a page of heads in `heads`)."""
    cfg = entry.cfg
    layer = check_int("layer", layer, 0, cfg.n_layers - 1)
    head, page = check_head(head, cfg.n_heads)
    return View(layer, head, check_choice("view", view, ATTENTION_VIEWS), page)


def changed_display(d: Display, colour=None, presentation=None, screen=None) -> Display:
    """`d` with these settings changed (None leaves one as it is). screen: "WIDTHxHEIGHT" of the
    browser window in CSS pixels."""
    colour = d.colour if colour is None else check_choice("colour", colour, COLOUR_MODES)
    if presentation is not None and not isinstance(presentation, bool):
        raise UserError("presentation must be true or false.")
    width, height = d.width, d.height
    if screen is not None:
        size = whole_numbers(screen, "x", 2)
        if size is None:
            raise UserError("screen must look like 1366x900.")
        width, height = (min(max(p, 200), 8000) for p in size)
    return Display(colour, d.presentation if presentation is None else presentation, width, height, d.tool)


def with_tool(d: Display, tool) -> Display:
    """`d` showing another head tool (one of HEAD_TOOLS)."""
    return dataclasses.replace(d, tool=check_choice("head tool", tool, HEAD_TOOLS))
