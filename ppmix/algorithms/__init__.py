"""Pure numerical algorithms with no model in them, below every engine, model and family that calls them:
batched forward–backward and Viterbi (:mod:`.forward_backward`), forward filtering backward sampling
(:mod:`.ffbs`), batched damped Newton (:mod:`.newton`), monotone Newton ascent (:mod:`.ascent`), the probability
simplex (Euclidean projection onto it, Dirichlet draws and densities: :mod:`.simplex`) and floored frequencies
(water-filling, :mod:`.floored_simplex`) and Lloyd's k-means with k-means++ seeding, batched over runs
(:mod:`.kmeans`).

Each module takes tensors and returns tensors; none imports a model, an engine or a family.
"""
