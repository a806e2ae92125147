"""Which models can I use: what anyone may open, and the models one person added.

The shipped built-ins and how a prompt is read for any model (`lab.catalogue.models`), the operator's list
(`lab.catalogue.external`), opening a model from its own files and choosing its first view
(`lab.catalogue.realmodels`, measured by `python -m lab.catalogue.first_views`), a person's own models
(`lab.catalogue.ownmodels`) and models in and out as files (`lab.catalogue.uploads`). Nothing here imports the
session: the person's lab reads the catalogue, never the other way round.
"""
