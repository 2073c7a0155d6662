"""Small tensor helpers with no other ppmix imports: column moments and scales (:mod:`.scaling`), the rule that
says one fit beats another (:mod:`.selection`), log-space normalisation (:mod:`.logspace`) and thread control
(:mod:`.threads`). The algorithms (k-means among them) live in :mod:`ppmix.algorithms`."""
