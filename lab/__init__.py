"""The lab layer, between the engine (model/) and the Gradio wiring (ui/, app.py), by audience.

At the top, one person's lab: `lab.session.Session` has the verbs the UI calls, over its parts: the text and
its history (`lab.text`), display settings (`lab.display`), own models (`lab.catalogue.ownmodels`), and the
parts with verbs of their own that the UI calls as `session.<part>.<verb>`: the head tools (`lab.heads`, over
`lab.headsettings`, `lab.roles`, `lab.compare`), Inside one cell (`lab.inside`), patching sweeps
(`lab.sweeps`, over `lab.patching`) and training (`lab.training`); a Step's result is a `lab.shown.Shown`.
`lab.limits` holds every option and limit (one home) and `lab.checks` the checks that turn form and API values
into Python values: every part of lab/ reads those two.

`lab.catalogue`: the models anyone may open (the built-ins, the operator's list, sources read from disk and the
models a person trained or uploaded) and how a prompt is read for one. `lab.server`: what the server shares
between people (sessions, request rates, the memory and disk budgets, warm texts, the files sessions make); it
never imports a person's lab. No gradio here, and nothing from app.py. ARCHITECTURE.md draws the whole map.
"""
