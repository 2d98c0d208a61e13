"""What every runtime hosting Linnet models shares (pure Python, no array library), by idea:

* :mod:`.loading`: a model file's checked program, ``config=``, ``weights=``, ``dtype=`` and a
  checkpoint's headers (what every runtime's ``load`` does before it reads tensors);
* :mod:`.inputs`: entry inputs bound and checked;
* :mod:`.config`: config files and ``--set`` overrides;
* :mod:`.run`: `linnet run`'s model, config and weights (the demo checkpoint included);
* :mod:`.options`: `linnet run`'s and ``generate``'s options (ranks, prompt, sampling, seed);
* :mod:`.printing`: the lines `linnet run` prints;
* :mod:`.generate`: ``Model.generate``'s checks and host side;
* :mod:`.verdicts`: kernel checks' findings.

Nothing here imports the `linnet` command line (:mod:`linnet.lang.cli` imports from here).
"""
