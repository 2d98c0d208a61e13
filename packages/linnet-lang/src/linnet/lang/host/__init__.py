"""What every runtime hosting Linnet models shares (pure Python, no array library): entry
inputs (:mod:`.inputs`) and ``Model.generate``'s checks and host side (:mod:`.generate`).
The rest of :mod:`linnet.lang.hosting` moves here by idea."""
