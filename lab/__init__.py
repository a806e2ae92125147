"""The lab layer: one person's Decoder Lab session, between the engine and the Gradio wiring.

`lab.session.Session` has the verbs the UI calls, over its parts: the text and its history
(`lab.text`), display settings (`lab.display`), own models (`lab.ownmodels`), the training run
(`lab.training`); a Step's result is a `lab.frame.Frame`; the head tools are plain functions
(`lab.probing`, `lab.roles`, `lab.compare`); `lab.models` the built-in registry; `lab.limits` every option and limit (one home);
`lab.checks` the checks that turn form and API values into Python values; `lab.files` the
files a session makes. No gradio here, and nothing from app.py.
"""
