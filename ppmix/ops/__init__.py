"""Small tensor helpers with no other ppmix imports: k-means initialisation (:mod:`.kmeans`), column moments and
scales (:mod:`.scaling`), the rule that says one fit beats another (:mod:`.selection`), log-space normalisation
(:mod:`.logspace`) and thread control (:mod:`.threads`). The algorithms live in :mod:`ppmix.algorithms`."""
