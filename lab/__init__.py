"""The lab layer: one person's Decoder Lab session, between the engine and the Gradio wiring.

`lab.session.Session` holds a person's text, models and training run and has the verbs the
UI calls; `lab.models` the built-in registry; `lab.limits` every option and limit (one home);
`lab.checks` the checks that turn form and API values into Python values; `lab.files` the
files a session makes. No gradio here, and nothing from app.py.
"""
