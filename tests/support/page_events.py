"""What the page has asked the app and not yet been answered, as the browser tests see it.

Gradio's page sends each event to the server (`POST …/queue/join`, or `POST …/run/…` for an event outside
the queue) and reads the answers from one event stream per session (`GET …/queue/data`), all through
`window.fetch`. `TRACKER`, added to a page before its scripts run, wraps `fetch` to keep count: the calls
whose request has no reply yet, the queued events joined and not yet completed (their `process_completed`
read from a copy of the stream), and, in order, the function number (fn_index) of every call answered. The
app's own requests are passed on untouched.

A test waits on these counts instead of on a time: `IDLE` holds once nothing is on its way, no loading
overlay (gradio's status tracker) covers a component, and the page has no head-tools refresh scheduled
(assets/explore.js asks for one 250 ms after the text or the selected token last changed, `lab.sig`, and
records what it asked for in `lab.toolsSig`; a refresh counts as due while the two differ and the page
applied a change within the last TOOLS_DUE_MS: a refresh scheduled for one text is not cancelled when the
text comes back to the one the tools follow, and then leaves the two apart for good). It must hold on
several looks in a row, each a task of the page apart: an answer read from the stream is applied by
gradio a task later, and an event chained after it (`.then`, `.success`) is sent only then.
"""

from __future__ import annotations

TRACKER = """
(() => {
  if (window.__labEvents) return;
  const ev = window.__labEvents = {waiting: 0, pending: new Map(), early: new Set(), done: [], streak: 0,
                                  log: [], msgs: {}};
  const note = (what) => { ev.log.push(`${Math.round(performance.now())} ${what}`); if (ev.log.length > 40) ev.log.shift(); };
  const real = window.fetch;
  const fnOf = (init) => { try { return JSON.parse(init.body).fn_index; } catch (e) { return null; } };
  const completed = (id) => {
    if (!ev.pending.has(id)) { ev.early.add(id); return; }  // answered before its join's reply was read
    ev.done.push(ev.pending.get(id));
    ev.pending.delete(id);
  };
  const read = async (body) => {
    const reader = body.getReader(), decoder = new TextDecoder();
    let text = '';
    try {
      for (;;) {
        const {value, done} = await reader.read();
        if (done) { note('stream ended'); return; }
        text += decoder.decode(value, {stream: true});
        let end;
        while ((end = text.indexOf('\\n')) >= 0) {
          const line = text.slice(0, end).trim();
          text = text.slice(end + 1);
          if (!line.startsWith('data:')) continue;
          let m;
          try { m = JSON.parse(line.slice(5)); } catch (e) { continue; }
          if (m && m.event_id) ev.msgs[m.event_id] = (ev.msgs[m.event_id] || '') + ' ' + m.msg;
          if (m && m.msg === 'close_stream') note('close_stream');
          if (m && m.msg === 'process_completed' && m.event_id) completed(m.event_id);
        }
      }
    } catch (e) { note('stream closed: ' + e); /* its page goes away or gradio opens another */ }
  };
  window.fetch = function (input, init) {
    const url = String(input instanceof Request ? input.url : input).split('?')[0];
    if (/\\/queue\\/data$/.test(url)) {
      note('stream opened');
      return real.call(this, input, init).then((res) => {
        note(`stream answered ${res.status}`);
        if (res.ok && res.body) read(res.clone().body);
        return res;
      });
    }
    const join = /\\/queue\\/join$/.test(url), run = /\\/gradio_api\\/run\\//.test(url);
    if (!join && !run) return real.call(this, input, init);
    const fn = init ? fnOf(init) : null;
    ev.waiting++;
    return real.call(this, input, init).then(async (res) => {
      try {
        const id = join && res.ok ? (await res.clone().json()).event_id : null;
        note(`fn ${fn} joined: ${res.status} ${id ? id.slice(0, 8) : ''}`);
        if (id && ev.early.delete(id)) ev.done.push(fn);
        else if (id) ev.pending.set(id, fn);
        else ev.done.push(fn);  // answered by the reply itself (outside the queue, or refused at the door)
      } catch (e) {
        ev.done.push(fn);
      } finally {
        ev.waiting--;
      }
      return res;
    }, (err) => { ev.waiting--; throw err; });
  };
})();
"""

# True once the page has been quiet on `looks` looks in a row (see the module's docstring).
IDLE = """looks => {
  const TOOLS_DUE_MS = 1000;  // four times explore.js's 250 ms: its timer has fired by then
  const ev = window.__labEvents, lab = window.decoderLab;
  if (!ev) return false;
  const covered = [...document.querySelectorAll('[data-testid="status-tracker"]')].some(
      t => !t.classList.contains('hide') && !t.querySelector('.error') && t.getClientRects().length > 0);
  if (lab && lab.applied !== ev.applied) { ev.applied = lab.applied; ev.appliedAt = performance.now(); }
  const toolsDue = !!lab && lab.sig !== undefined && lab.sig !== lab.toolsSig
                   && !!document.querySelector('#refresh_tools')
                   && performance.now() - ev.appliedAt < TOOLS_DUE_MS;
  const quiet = ev.waiting === 0 && ev.pending.size === 0 && !covered && !toolsDue;
  ev.streak = quiet ? ev.streak + 1 : 0;
  return ev.streak >= looks;
}"""

# What keeps the page from being idle, for a failure's message: the calls on their way (by function number), the
# components a loading overlay covers, and whether a head-tools refresh is due.
BUSY = """() => {
  const ev = window.__labEvents, lab = window.decoderLab;
  if (!ev) return 'the page has no event tracker';
  return {waiting: ev.waiting, pending: [...ev.pending.values()],
          covered: [...document.querySelectorAll('[data-testid="status-tracker"]')]
            .filter(t => !t.classList.contains('hide') && !t.querySelector('.error') && t.getClientRects().length)
            .map(t => (t.closest('[id]') || {}).id || t.className),
          toolsDue: !!lab && lab.sig !== lab.toolsSig, answered: ev.done.length,
          messages: [...ev.pending.keys()].map(id => `${id.slice(0, 8)}:${ev.msgs[id] || ' none'}`),
          log: ev.log.slice(-20)};
}"""

# The function numbers of the app's events named `name`: its api_name, or "load" for the page's load event.
FNS_NAMED = """name => (window.gradio_config.dependencies || []).filter(
    d => d.api_name === name || (name === 'load' && (d.targets || []).some(t => t[1] === 'load'))).map(d => d.id)"""

# True once a call of one of the functions `fns` was answered after the first `since` answers.
ANSWERED = """([fns, since]) => (window.__labEvents?.done || []).slice(since).some(f => fns.includes(f))"""

# The component `sel` is shown and no loading overlay of its own (gradio's status tracker, which covers its
# block while an event that answers into it runs) lies over it.
UNCOVERED = """sel => {
  const el = document.querySelector(sel);
  if (!el || !el.getClientRects().length) return false;
  const block = el.closest('.block') || el;
  const tracker = block.querySelector(':scope > [data-testid="status-tracker"]');
  return !tracker || tracker.classList.contains('hide') || !tracker.getClientRects().length;
}"""
