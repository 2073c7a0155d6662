"""Numerics with no other ppmix imports: k-means initialisation (:mod:`.kmeans`), damped Newton
(:mod:`.newton`), monotone Newton ascent (:mod:`.ascent`), Euclidean projection onto the simplex
(:mod:`.simplex`), log-space normalisation (:mod:`.logspace`) and thread control (:mod:`.threads`)."""
