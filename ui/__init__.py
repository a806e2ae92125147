"""The Gradio wiring of Decoder Lab, one module per tab (app.py lays them out and launches).

common: the handler wrapper, API values; explore, positional, train: each tab's handlers;
http: the guard in front of gradio's routes. Imports: ui → lab, viz (never the other way).
"""
