() => {
  // Decoder Lab's page behaviour: what must answer at once, without a round trip to the server.
  // * Clicking a token (or ←/→) selects it as the query: its row is outlined in every panel of the
  //   attention figure and the text is shaded by how much that query attends to each earlier token.
  //   The numbers come from the figure itself (layout.meta.shade, see viz/linking.py); gradio's own
  //   select event asks the server for the distribution the token was drawn from.
  // * Shortcuts: S step, G generate, U undo, ←/→ move the query, Esc back to the last token.
  // * A figure drawn while its tab was hidden is laid out again when the tab is shown.
  // * "rows | columns" in the shading note: rows = where the selected token looks (its query row),
  //   columns = who looks at it (its key column, every later token's weight on it).
  const lab = (window.decoderLab = { query: null, tokensKey: "", applied: 0, direction: "row", cell: "" });

  // One Plotly draw per figure update. gradio's Plot keys its plot element on the value: every new
  // value mounts a fresh element, but the element about to be dropped first redraws the new value too
  // (its effect runs before the keyed block replaces it), so each update cost two full draws, the
  // first thrown away: 110 of a Step's 180 ms of drawing in Chromium for GPT-2's six heads
  // (bench/RESULTS.md). A fresh element is drawn at once, as before; a redraw of an element already
  // drawn waits for the next animation frame (or 100 ms where the page is hidden and frames stop) and
  // is skipped if the element has left the page by then, else drawn with the last figure it was given.
  // Plotly is wrapped the moment gradio sets window.Plotly.
  const drawOnce = (P) => {
    if (!P || P.__labOnce || typeof P.react !== "function") return P;
    const react = P.react;
    const queued = new Map(); // element -> { args, settle: [[resolve, reject], ...] }
    // the last 100 draws, [figure's element id, "now" | "frame" | "skipped", ms of the synchronous part]
    // (bench/browser_real.py reads them)
    const log = (lab.draws = []);
    const note = (gd, when, ms) => {
      const block = gd.closest("[id]"); // a dropped element: its id within what was dropped, if any
      log.push([block ? block.id : "", when, ms]);
      if (log.length > 100) log.shift();
    };
    const draw = (gd, args, when) => {
      const t = performance.now();
      try { return react.call(P, gd, ...args); } finally { note(gd, when, performance.now() - t); }
    };
    let timer = null, frame = null;
    const run = () => {
      clearTimeout(timer); cancelAnimationFrame(frame); timer = frame = null;
      const jobs = [...queued.entries()];
      queued.clear();
      for (const [gd, job] of jobs) {
        let out;
        if (!gd.isConnected) { // replaced before it was drawn again: nothing to show
          note(gd, "skipped", 0);
          out = Promise.resolve(gd);
        } else try { out = Promise.resolve(draw(gd, job.args, "frame")); } catch (err) { out = Promise.reject(err); }
        out.then((v) => job.settle.forEach(([ok]) => ok(v)), (err) => job.settle.forEach(([, no]) => no(err)));
      }
    };
    P.react = function (gd, ...args) {
      if (!(gd instanceof Element)) return react.call(this, gd, ...args); // an id: as plotly.js takes it
      if (!gd._fullLayout) return draw(gd, args, "now"); // an element's first draw: at once
      const job = queued.get(gd) || { settle: [] };
      job.args = args;
      queued.set(gd, job);
      if (frame === null) { frame = requestAnimationFrame(run); timer = setTimeout(run, 100); }
      return new Promise((ok, no) => job.settle.push([ok, no]));
    };
    P.__labOnce = true;
    return P;
  };
  if (window.Plotly) drawOnce(window.Plotly);
  else {
    let plotly;
    Object.defineProperty(window, "Plotly", { configurable: true, enumerable: true,
      get: () => plotly, set: (v) => { plotly = drawOnce(v); } });
  }
  const OUTLINE = "#ff2d95";
  const tokenEls = () => Array.from(document.querySelectorAll("#tokens .textfield .token"));
  const plotDiv = () => document.querySelector("#attention .js-plotly-plot");
  const shadeOf = (gd) => {
    const meta = gd && gd._fullLayout && (gd._fullLayout.meta || (gd.layout && gd.layout.meta));
    return meta && meta.shade ? meta.shade : null;
  };
  const bytesCache = { key: null, bytes: null };
  const bytesOf = (shade) => {
    if (bytesCache.key !== shade.data) {
      const raw = atob(shade.data);
      const out = new Uint8Array(raw.length);
      for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
      bytesCache.key = shade.data;
      bytesCache.bytes = out;
    }
    return bytesCache.bytes;
  };
  // The weights of query q on keys 0..q (the chosen head, or the mean of the layer's heads).
  const rowOf = (shade, q) => {
    const b = bytesOf(shade), T = shade.T, n = shade.square ? T : q + 1;
    const perHead = shade.square ? T * T : (T * (T + 1)) / 2;
    const start = shade.square ? q * T : (q * (q + 1)) / 2;
    const heads = shade.head === null || shade.head === undefined ? [...Array(shade.heads).keys()] : [shade.head];
    const row = new Float64Array(n);
    for (const h of heads) {
      const scale = shade.rowmax[h][q] / shade.levels; // bytes are weights ÷ the row's largest weight
      for (let j = 0; j < n; j++) row[j] += b[h * perHead + start + j] * scale;
    }
    for (let j = 0; j < n; j++) row[j] /= heads.length;
    return row;
  };
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);

  // The span of positions a..b on axis `a` in page pixels, clipped to the panel: [start, end].
  const span = (a, lo, hi) => [Math.max(a._offset, a._offset + Math.min(a.l2p(lo), a.l2p(hi))),
    Math.min(a._offset + a._length, a._offset + Math.max(a.l2p(lo), a.l2p(hi)))];
  function outline(gd, q) {
    if (!gd) return 0;
    const box = gd.querySelector(".svg-container") || gd;
    box.querySelectorAll(".lab-outline").forEach((e) => e.remove());
    const L = gd._fullLayout;
    if (q === null || !L) return 0;
    let drawn = 0;
    for (const key of Object.keys(L).filter((k) => /^yaxis\d*$/.test(k))) {
      const ya = L[key], xa = L["xaxis" + key.slice(5)];
      if (!ya || !xa || typeof ya.l2p !== "function" || ya.type !== "category") continue;
      const t = xa._categories ? xa._categories.length : shadeOf(gd).T;
      // a row: query q across every key; a column: key q down every query
      const [along, across] = lab.direction === "column" ? [xa, ya] : [ya, xa];
      const [a0, a1] = span(along, q - 0.5, q + 0.5);
      if (a1 - a0 < 0.5) continue; // scrolled out of the panel
      const [b0, b1] = span(across, -0.5, t - 0.5);
      const [x0, x1, y0, y1] = lab.direction === "column" ? [a0, a1, b0, b1] : [b0, b1, a0, a1];
      const div = document.createElement("div");
      div.className = "lab-outline";
      div.dataset.axis = key;
      Object.assign(div.style, {
        position: "absolute", left: `${x0 - 1}px`, top: `${y0 - 1}px`, width: `${x1 - x0 + 2}px`,
        height: `${y1 - y0 + 2}px`, border: `2px solid ${OUTLINE}`, boxShadow: "0 0 0 1px #fff",
        pointerEvents: "none", boxSizing: "border-box", zIndex: 5,
      });
      box.appendChild(div);
      drawn++;
    }
    return drawn;
  }

  // The text strip scrolls when it holds more lines than it shows (a short window): keep the
  // query token in sight there, without scrolling the page itself.
  function keepInStrip(el) {
    const strip = el.closest(".textfield");
    if (!strip || strip.scrollHeight <= strip.clientHeight) return;
    const top = el.getBoundingClientRect().top - strip.getBoundingClientRect().top + strip.scrollTop;
    if (top < strip.scrollTop || top + el.offsetHeight > strip.scrollTop + strip.clientHeight) {
      strip.scrollTop = Math.max(0, top - (strip.clientHeight - el.offsetHeight) / 2);
    }
  }

  function shadeText(shade, q, els) {
    const note = document.querySelector("#shade_note");
    els.forEach((el) => {
      el.classList.remove("lab-query", "lab-future", "lab-strong");
      el.style.removeProperty("--lab-shade");
      el.removeAttribute("title");
    });
    if (!shade || q === null || shade.T !== els.length) {
      if (note) note.innerHTML = "";
      return;
    }
    // rows: the weights of query q on each key; columns: the weight each query puts on key q
    const column = lab.direction === "column";
    const line = column ? els.map((_, i) => (shade.square || i >= q ? rowOf(shade, i)[q] : null)) : Array.from(rowOf(shade, q));
    let top = 0;
    for (const v of line) top = Math.max(top, v || 0);
    // the shade is the weight itself: full yellow = weight 1, a row spread thin stays pale
    const who = shade.head === null || shade.head === undefined ? `mean of the ${shade.heads} heads` : `head ${shade.head}`;
    els.forEach((el, j) => {
      if (j < line.length && line[j] !== null) {
        const v = Math.min(1, line[j]);
        el.style.setProperty("--lab-shade", v.toFixed(3));
        el.classList.toggle("lab-strong", v > 0.5);
        const [i, k] = column ? [j, q] : [q, j];
        el.title = `query ${i} → key ${k}: weight ${line[j].toFixed(3)} (layer ${shade.layer}, ${who})`;
      } else {
        el.classList.add("lab-future");
        el.title = column ? `position ${j} comes before the key: it cannot look at it` :
          `position ${j} comes after the query: masked`;
      }
    });
    els[q].classList.add("lab-query");
    keepInStrip(els[q]);
    const text = els[q].querySelector(".text");
    if (note) {
      const word = `<b>“${esc(text ? text.textContent : "")}”</b> (position ${q})`;
      const what = column ? `how much each token looks at ${word}` : `where ${word} looks`;
      const pick = (d, label) => `<button type="button" class="lab-dir${lab.direction === d ? " lab-dir-on" : ""}" ` +
        `data-dir="${d}" aria-pressed="${lab.direction === d}">${label}</button>`;
      note.innerHTML = `<span class="lab-note">${pick("row", "rows")}${pick("column", "columns")} ` +
        `Shading: ${what} in layer ${shade.layer}, ${who}: full yellow = weight 1 (largest here ` +
        `${top.toFixed(2)}). Hover a token for its weight; click another, or use ←/→.</span>`;
    }
  }

  function apply() {
    const els = tokenEls();
    const key = els.map((e) => e.textContent).join("\u0001");
    if (key !== lab.tokensKey) { // a new text (Step, Undo, Generate, Reset): the last token is the query
      lab.tokensKey = key;
      lab.query = null;
    }
    const gd = plotDiv();
    const shade = shadeOf(gd);
    const q = !els.length ? null : lab.query === null ? els.length - 1 : Math.min(lab.query, els.length - 1);
    const ok = shade && shade.T === els.length;
    outline(gd, ok ? q : null);
    shadeText(ok ? shade : null, q, els);
    lab.applied++;
    lab.sig = key + "#" + (lab.query === null ? "last" : q);
    scheduleTools(lab.sig);
  }
  // The head tools under the text follow it once it has stayed the same for a moment: quick
  // Steps (or held arrow keys) never wait behind them (ui/heads_tab.py, "refresh_tools").
  let toolsTimer = null;
  lab.toolsSig = "#last"; // the page opens with no text: nothing to ask for until there is one
  const scheduleTools = (sig) => {
    clearTimeout(toolsTimer); // a refresh still pending for a text since left is dropped, even when back on the followed one
    if (sig === lab.toolsSig) return;
    toolsTimer = setTimeout(() => {
      const b = document.querySelector("#refresh_tools");
      if (!b) return;
      lab.toolsSig = sig;
      b.click();
      // the open "Inside one cell" panel follows a new text or token, not a cell clicked since
      const inside = document.querySelector("#inside > .label-wrap.open, #inside .label-wrap.open");
      const refresh = document.querySelector("#inside_refresh");
      if (inside && refresh && lab.insideSig !== sig) { lab.insideSig = sig; refresh.click(); }
    }, 250);
  };
  lab.apply = apply;

  let pending = false;
  const schedule = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; apply(); });
  };
  const watch = () => {
    const targets = ["#attention", "#tokens"].map((s) => document.querySelector(s));
    if (targets.some((t) => !t)) return setTimeout(watch, 200);
    const obs = new MutationObserver((muts) => {
      if (muts.every((m) => [...m.addedNodes, ...m.removedNodes].every((n) => n.classList && n.classList.contains("lab-outline")))) return;
      schedule();
    });
    targets.forEach((t) => obs.observe(t, { childList: true, subtree: true, characterData: true }));
    window.addEventListener("resize", () => setTimeout(schedule, 120));
    schedule();
  };
  watch();

  // A click on a head, in the head-role overviews (cells carry [layer, head]) or in a panel of the
  // attention figure (layout.meta.panels names each panel's axes): the server either shows that
  // head or, with "clicking picks", adds it to the heads to ablate (ui/heads.pick_head).
  const pickFrom = (gd, ev) => {
    const pt = ev && ev.points && ev.points[0];
    const meta = gd._fullLayout && gd._fullLayout.meta;
    if (!pt || (meta && meta.pick === "none")) return null; // the lines view: its points are weights, not heads
    if (Array.isArray(pt.customdata) && pt.customdata.length >= 2) return `${pt.customdata[0]},${pt.customdata[1]}`;
    const xa = pt.xaxis && pt.xaxis._id, ya = pt.yaxis && pt.yaxis._id;
    const panel = meta && meta.panels && meta.panels.find((p) => p.xaxis === xa && p.yaxis === ya);
    return panel ? `${panel.layer},${panel.head}` : null;
  };
  // Each button's event reads its value from `lab` when it is sent.
  const press = (sel, key, value) => { const b = document.querySelector(sel); if (b) { lab[key] = value; b.click(); } };
  const picks = (btn, key) => (gd, ev) => { const pick = pickFrom(gd, ev); if (pick) press(btn, key, pick); };
  // The Circuits tab's maps (ui/circuits_tab.py): a head's cell of the DLA map selects that head in Explore and
  // opens it in Inside one cell (#circuits_dla_pick); a cell of a composition map ([layer, head, later layer, head])
  // or a pair of its list selects the later head in Explore and opens the earlier one's circuits here.
  const openPair = (kind, q) => {
    if (!/^[qkv]$/.test(kind) || q.length !== 4 || !q.every(Number.isInteger) || q[0] >= q[2]) return;
    press("#pick_head", "pick", `${q[2]},${q[3]}`);
    press("#circuits_pair_pick", "circuitsPair", `${kind},${q.join(",")}`);
  };
  const headClick = (gd, ev) => { const pick = pickFrom(gd, ev); // an MLP's cell names no head
    if (pick) { press("#pick_head", "pick", pick); press("#circuits_dla_pick", "circuitsHead", pick); } };
  const pairClick = (gd, ev) => { const pt = ev && ev.points && ev.points[0], cd = pt && pt.customdata;
    if (cd && cd.length === 4 && Number.isFinite(pt.z)) openPair(gd._fullLayout.meta.kind, Array.from(cd, Number)); };
  const hookPicks = () => {
    // a cell of the patching map opens its head with both prompts (ui/patching.py), through its own button
    const head = picks("#pick_head", "pick");
    for (const [sel, onClick] of [["#head_roles", head], ["#cmp_scores", head], ["#attention", head],
      ["#patch_map", picks("#patch_pick", "patchPick")],
      ["#circuits_dla", headClick], ["#circuits_composition", pairClick]]) {
      const gd = document.querySelector(`${sel} .js-plotly-plot`);
      if (!gd || gd._labPick || typeof gd.on !== "function") continue;
      gd._labPick = true;
      gd.on("plotly_click", (ev) => onClick(gd, ev));
    }
  };
  document.addEventListener("click", (e) => { // a pair of the strongest-pairs list: "L0H1 → L1H2: 0.412"
    const item = e.target.closest && e.target.closest("#circuits_pairs li");
    const m = item && /L(\d+)H(\d+)\s*→\s*L(\d+)H(\d+)/.exec(item.textContent || "");
    const kind = m && /Strongest ([QKV])-composition/.exec(document.querySelector("#circuits_pairs").textContent);
    if (kind) openPair(kind[1].toLowerCase(), m.slice(1, 5).map(Number));
  });
  lab.hookPicks = hookPicks;
  // The lines view (viz/layer_heads.py) is drawn again for each token clicked: the heads its legend hid
  // stay hidden while the layer and its number of heads stay the same (each head's traces carry
  // legendgroup "h<head>"; the legend's own entries are the traces named by their head's number).
  const hidden = { key: "", heads: [] };
  const linesKey = (gd) => {
    const m = gd && gd._fullLayout && gd._fullLayout.meta;
    return m && m.viz === "layer_heads" ? `${m.layer}/${m.heads}` : null;
  };
  const keepHidden = () => {
    const gd = plotDiv(), P = window.Plotly, key = linesKey(gd);
    if (!key || !gd.data || !P || typeof gd.on !== "function") return;
    if (!gd._labLegend) {
      gd._labLegend = true;
      gd.on("plotly_restyle", () => {
        hidden.key = linesKey(gd);
        hidden.heads = gd.data.filter((t) => t.showlegend && t.visible === "legendonly").map((t) => t.legendgroup);
      });
    }
    if (gd._labLegendData === gd.data) return; // this figure had its hidden heads already
    gd._labLegendData = gd.data;
    if (hidden.key !== key || !hidden.heads.length) return;
    const idx = [];
    gd.data.forEach((t, i) => { if (hidden.heads.includes(t.legendgroup) && t.visible !== false) idx.push(i); });
    if (idx.length) P.restyle(gd, { visible: "legendonly" }, idx);
  };
  lab.keepHidden = keepHidden;
  // A click on a cell of the attention (query row, key column) or on an entry of the head's matrices
  // (a Q row picks the query, a K or V row the key) works that cell through in the "Inside one cell"
  // panel (ui/inside_tab.py): "layer,head,query,key" in lab.cell, then the hidden #pick_cell.
  const posOf = (label) => { const m = /\((\d+)\)$/.exec(String(label)); return m ? Number(m[1]) : null; };
  const cellFrom = (gd, ev) => {
    const pt = ev && ev.points && ev.points[0], meta = gd._fullLayout && gd._fullLayout.meta;
    if (!pt || !meta || !meta.panels) return null;
    const panel = meta.panels.find((p) => p.xaxis === (pt.xaxis && pt.xaxis._id) && p.yaxis === (pt.yaxis && pt.yaxis._id));
    if (!panel) return null;
    if (meta.viz === "inside_matrices") {
      const row = posOf(pt.y), col = panel.cols === "key" ? posOf(pt.x) : Math.round(Number(pt.x));
      const q = panel.rows === "query" ? row : meta.query, k = panel.cols === "key" ? col : panel.rows === "key" ? row : meta.key;
      return `${meta.layer},${meta.head},${q},${k}`;
    }
    const q = posOf(pt.y), k = posOf(pt.x);
    return q === null || k === null ? null : `${panel.layer},${panel.head},${q},${k}`;
  };
  const hookCells = () => {
    for (const sel of ["#attention", "#inside_matrices"]) {
      const gd = document.querySelector(`${sel} .js-plotly-plot`);
      if (!gd || gd._labCell || typeof gd.on !== "function") continue;
      gd._labCell = true;
      gd.on("plotly_click", (ev) => {
        const cell = cellFrom(gd, ev), button = document.querySelector("#pick_cell");
        const picking = document.querySelector("#picking input"); // "clicking picks heads" to ablate: not a cell
        if (!cell || !button || (sel === "#attention" && picking && picking.checked)) return;
        lab.cell = cell;
        lab.insideSig = lab.sig; // the panel shows this cell now, until the text or the token changes
        button.click();
      });
    }
  };
  lab.hookCells = hookCells;
  new MutationObserver(() => requestAnimationFrame(() => { hookPicks(); lab.hookCells(); keepHidden(); }))
    .observe(document.body, { childList: true, subtree: true });

  const select = (i) => {
    const els = tokenEls();
    if (!els.length) return;
    i = Math.max(0, Math.min(els.length - 1, i));
    els[i].click(); // gradio's select event asks the server for the distribution; our listener does the rest
  };
  document.addEventListener("click", (e) => {
    const dir = e.target.closest && e.target.closest("#shade_note .lab-dir");
    if (dir) { // rows ⇄ columns: the outline and the shading follow at once, no round trip
      lab.direction = dir.dataset.dir === "column" ? "column" : "row";
      apply();
      return;
    }
    const el = e.target.closest && e.target.closest("#tokens .textfield .token");
    if (el) {
      lab.query = tokenEls().indexOf(el);
      apply();
    }
    const tab = e.target.closest && e.target.closest("button[role='tab']");
    if (tab) [60, 300].forEach((ms) => setTimeout(() => window.dispatchEvent(new Event("resize")), ms));
  }, true);
  document.addEventListener("keydown", (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey || e.isComposing) return;
    const t = e.target;
    if (t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName))) return;
    const n = tokenEls().length;
    const current = lab.query === null ? n - 1 : lab.query;
    const click = (sel) => { const b = document.querySelector(sel); if (b) { e.preventDefault(); b.click(); } };
    switch (e.key) {
      case "s": case "S": click("#step"); break;
      case "g": case "G": click("#generate"); break;
      case "u": case "U": click("#undo"); break;
      case "ArrowLeft": if (n) { e.preventDefault(); select(current - 1); } break;
      case "ArrowRight": if (n) { e.preventDefault(); select(current + 1); } break;
      case "Escape": if (n) select(n - 1); break;
    }
  });

  // ------------------------------------------------------------------------------------------------
  // Figure export, separate from everything above: every Plotly figure on the page, in
  // every tab and whenever it is drawn, gets two small buttons, "PNG" and "SVG", in its bottom-left
  // corner (the figures' titles sit top-left and plotly's modebar top-right). A click downloads the
  // figure as drawn (its size and fonts: "Large fonts" gives presentation-size files) through the
  // plotly.js already in the page: Plotly.downloadImage, or, where window.Plotly is not exposed, the
  // modebar's camera button with gd._context.toImageButtonOptions set. PNG at scale 2. Nothing is
  // fetched. File name: layout.meta.filename when the server set one, else the title's text, else
  // the plot's (or its block's) element id; only [A-Za-z0-9._-], at most 100 characters.
  // Like plotly's own tool bar they show while the pointer is over the figure (or a key focuses them),
  // so they never cover the figure in a screenshot or on a projector. On a touch screen (a phone) they are
  // always shown, in a strip of their own under the figure, never over its key labels or colour bar.
  (() => {
    const BAR = "lab-export";
    if (!document.getElementById("lab-export-style")) {
      const style = document.createElement("style");
      style.id = "lab-export-style";
      style.textContent = `
        .${BAR} { position: absolute; left: 4px; bottom: 4px; z-index: 20; display: flex; gap: 4px;
                  opacity: 0; transition: opacity 0.15s; }
        .js-plotly-plot:hover > .${BAR}, .${BAR}:focus-within { opacity: 1; }
        @media (hover: none) { .${BAR} { opacity: 0.9; bottom: 2px; }
                               .js-plotly-plot:has(> .${BAR}) { padding-bottom: 34px; } }
        .js-plotly-plot > .${BAR} > button { all: unset; box-sizing: border-box; cursor: pointer; padding: 3px 7px;
                  font: 600 11px/1.2 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; letter-spacing: 0.02em;
                  border: 1px solid #9aa3b2; border-radius: 4px; background: rgba(255, 255, 255, 0.92); color: #374151; }
        .js-plotly-plot > .${BAR} > button:hover { border-color: #4b5563; color: #111111; }
        .js-plotly-plot > .${BAR} > button:focus-visible { outline: 2px solid #ff7c00; outline-offset: 1px; }
        .js-plotly-plot > .${BAR} > button[aria-busy="true"] { opacity: 0.55; cursor: progress; }
        .dark .js-plotly-plot > .${BAR} > button { background: rgba(31, 35, 42, 0.92); color: #e6e6e6; border-color: #6b7688; }
        .dark .js-plotly-plot > .${BAR} > button:hover { border-color: #cbd5e1; color: #ffffff; }
        @media (pointer: coarse) { .js-plotly-plot > .${BAR} > button { padding: 6px 10px; font-size: 13px; } }`;
      document.head.appendChild(style);
    }
    const clean = (s) => String(s || "").normalize("NFKD").replace(/[\u0300-\u036f]/g, "")
      .replace(/[^A-Za-z0-9._-]+/g, "_").replace(/_{2,}/g, "_").replace(/^[._-]+/, "").slice(0, 100).replace(/[._-]+$/, "");
    const titleText = (L) => {
      const t = L && L.title;
      const raw = typeof t === "string" ? t : t && t.text;
      if (!raw) return "";
      // plotly titles are HTML-like: tags become spaces, entities are decoded (DOMParser runs nothing)
      return new DOMParser().parseFromString(String(raw).replace(/<[^>]*>/g, " "), "text/html").body.textContent || "";
    };
    const metaOf = (gd) => {
      const m = (gd._fullLayout && gd._fullLayout.meta) || (gd.layout && gd.layout.meta);
      return m && typeof m === "object" && !Array.isArray(m) ? m : null;
    };
    const exportName = (gd) => {
      const meta = metaOf(gd);
      const block = gd.parentElement && gd.parentElement.closest("[id]");
      const tries = [meta && typeof meta.filename === "string" ? meta.filename : "",
                     titleText(gd._fullLayout || gd.layout), gd.id, block && block.id];
      for (const t of tries) { const s = clean(t); if (s) return s; }
      return "figure";
    };
    const exportFigure = (gd, format) => {
      const opts = { format, filename: exportName(gd), scale: format === "png" ? 2 : 1 };
      const P = window.Plotly;
      if (P && typeof P.downloadImage === "function") return Promise.resolve(P.downloadImage(gd, opts));
      const camera = gd.querySelector(".modebar-btn[data-title^='Download plot']");
      if (!camera || !gd._context) return Promise.reject(new Error("no plotly.js image export on this page"));
      const before = gd._context.toImageButtonOptions;
      gd._context.toImageButtonOptions = opts; // read when the camera is clicked
      try { camera.click(); } finally { gd._context.toImageButtonOptions = before; }
      return Promise.resolve(opts.filename + "." + format);
    };
    const addButtons = (gd) => {
      if (gd.querySelector(`:scope > .${BAR}`)) return;
      if (getComputedStyle(gd).position === "static") gd.style.position = "relative";
      const bar = document.createElement("div");
      bar.className = BAR;
      for (const [format, what] of [["png", "a PNG image (twice the size shown, for slides)"], ["svg", "an SVG vector image"]]) {
        const b = document.createElement("button");
        b.type = "button";
        b.textContent = format.toUpperCase();
        b.dataset.format = format;
        b.title = `Download this figure as ${what}`;
        b.setAttribute("aria-label", `Download figure as ${format.toUpperCase()}`);
        b.addEventListener("click", (e) => {
          e.preventDefault();
          e.stopPropagation();
          if (b.getAttribute("aria-busy") === "true") return;
          b.setAttribute("aria-busy", "true");
          exportFigure(gd, format).catch((err) => console.warn("figure export:", err))
            .then(() => b.removeAttribute("aria-busy"));
        });
        bar.appendChild(b);
      }
      gd.appendChild(bar);
    };
    let queued = false;
    const scan = () => { queued = false; document.querySelectorAll(".js-plotly-plot").forEach(addButtons); };
    const queue = () => { if (!queued) { queued = true; requestAnimationFrame(scan); } };
    new MutationObserver(queue).observe(document.body, { childList: true, subtree: true });
    queue();
    lab.exportName = exportName;
  })();
}
