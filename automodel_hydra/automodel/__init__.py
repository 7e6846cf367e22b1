"""NeMo AutoModel's room: everything this project knows of AutoModel, in one package.

* :mod:`.kind`: the AutoModel recipe kind, what its jobs answer every launcher
  (:class:`automodel_hydra.recipe_kind.RecipeKind`), and AutoModel's launcher defaults;
* :mod:`.files`: plan-time checks of an AutoModel file's sections and models;
* :mod:`.resume`: its resume keys, checked at plan time and resolved on rank 0;
* :mod:`.recipe`: an AutoModel recipe class run inside a rank our bootstrap placed;
* :mod:`.nemo_run`: AutoModel's ``nemo_run:`` launcher section as our launcher sections.

Outside this package only :mod:`automodel_hydra.recipe_kind` (the kinds' interface) imports it, and
:mod:`automodel_hydra.config` :mod:`.nemo_run` (a launcher section of AutoModel's files, read whatever the recipe):
tests/test_house.py pins it.
"""
