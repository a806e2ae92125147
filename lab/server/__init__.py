"""What the server shares between people, and the guards on it.

The sessions by gradio's session hash (`lab.server.sessionstore`), request rates per address
(`lab.server.rates`), the memory and disk budgets (`lab.server.budget`), the texts kept warm
(`lab.server.warm`) and the files sessions make (`lab.server.files`). Nothing here imports a person's lab
or the catalogue: only `lab.limits`, `lab.checks`, the engine and itself (tests/project/test_layers.py holds
it to that). A session is known here only by the little the guards ask of it (`Tenant`, `WarmTenant`).
"""
