"""The lab layer: one person's Decoder Lab session, between the engine and the Gradio wiring.

`lab.session.Session` has the verbs the UI calls, over its parts: the text and its history
(`lab.text`), display settings (`lab.display`), own models (`lab.ownmodels`), and the parts with verbs of
their own that the UI calls as `session.<part>.<verb>`: the head tools (`lab.heads`, over
`lab.headsettings`, `lab.roles`, `lab.compare`), Inside one cell (`lab.inside`), patching sweeps
(`lab.sweeps`, over `lab.patching`) and training (`lab.training`); a Step's result is a `lab.frame.Frame`;
`lab.models` the built-in registry; `lab.limits` every option and limit (one home);
`lab.checks` the checks that turn form and API values into Python values; `lab.files` the
files a session makes. No gradio here, and nothing from app.py.
"""
