"""Partly labelled fits: the discrete latents known for some rows (a mixture's components, an HMM's states)
clamped in every engine.

``Mixture.fit(X, known_labels=z)`` (and ``GMM``'s) takes ``z[n]`` the component of row ``n``, or -1 where it is
unknown; ``HMM.fit(X, known_states=s)`` one integer array per sequence, ``s[b][t]`` the state of step ``t`` or -1.
A known latent is *clamped*: it is no longer summed over, so every engine fits the joint density of the data
and the known latents,

    log p(X, z_known) = sum_n log sum_{k consistent with z_n} w_k p_k(x_n)        (a mixture)
    log p(X, s_known) = sum_b log sum_{paths consistent with s_b} p(path) prod_t p(x_bt | s_bt)   (an HMM),

which is what ``history_`` and ``lower_bound_`` report (per row, per step). One mechanism serves every engine:
a *log-mask* ``(..., K)``, zero where a state is allowed and ``-inf`` where it contradicts a known latent
(a row or step with -1 allows every state), added to the log joint of the latent.

- **EM**: the mixture's E-step scores ``log w_k + log p_k(x_n) + mask[n, k]`` (its responsibilities are then one
  for the known component, zero for the others); the HMM's E-step adds the mask to the emission log-densities
  before the forward-backward (:func:`~ppmix.algorithms.forward_backward.forward_backward` takes ``-inf``
  as probability zero), so the smoothed marginals and the expected transition counts are those of the paths
  consistent with the known states. Every M-step is unchanged, so EM still never decreases the objective; with
  every latent known, one M-step gives the supervised closed form (a Gaussian mixture's class frequencies,
  means and covariances; an HMM's counted initial states and transitions) and EM stays there.
- **SVI and MCMC**: the Pyro program adds ``pyro.factor(site + "_known", mask[n, z])`` beside every enumerated
  latent ``z`` (:meth:`Clamp.factor`), so ``TraceEnum_ELBO`` sums over the consistent values only and equals
  the EM objective above. MCMC's draws are not relabelled by default (``relabel=False``): the known latents
  name the components.
- **Gibbs** (``engine="gibbs"``), the sharded :func:`ppmix.distributed.fit_em` and online ``partial_fit`` do not
  take known latents (a ``ValueError`` naming the argument for Gibbs; the other two have no such argument).

**The start.** EM's start (and so SVI's and MCMC's, which is EM's) is one M-step from responsibilities that
are one-hot at the rows (steps) with a known latent. Where every state is known somewhere, the other rows go to
their cluster of a *seeded k-means* (:func:`seeded_kmeans`) on the points the default start clusters (the rows;
an HMM's frames): its centres start at the known rows' class means, the known rows stay in their class and the
others move to their nearest centre until none moves, so that a few known rows name the clusters the data hold
(a start at the known rows' class statistics pulled toward the whole data by the unknown rows puts every
component near the global mean when few rows are known, a saddle where EM stalls). The other rows' one-hot
clusters are softened as the default start softens them for the family (:mod:`ppmix.models._starts`); with
every latent known the start is exactly the supervised closed form (per-state frequencies, means, covariances,
counted transitions). Where some state is never known, the other rows keep the model's default start
(``init_params``, e.g. k-means), its clusters renumbered to agree best with the known latents (the assignment of
clusters to labels that keeps the most known rows: a Hungarian assignment on their contingency table).

**Impossible known states** are refused before the fit: each known state must be reachable from the sequence's
previous known one in as many moves as steps separate them, through the moves ``transition_pattern`` allows.

**After the fit** the known latents are gone: ``predict``, ``predict_proba``, ``score`` and ``to_arviz`` use the
fitted model alone (a row's prediction depends on that row and the model, whatever labels the fit was given).

**All unknown.** Known latents that are all -1 are no labels: the fit takes exactly the unsupervised path
(bit for bit the fit without the argument).

``y`` stays ignored by ``fit``, as scikit-learn's convention for clusterers requires: a pipeline that passes
``y`` never makes a fit semi-supervised; known latents are given by their own argument (in a pipeline,
``pipe.fit(X, gmm__known_labels=z)``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pyro
import torch
from pyro.ops.indexing import Vindex
from scipy.optimize import linear_sum_assignment

from ppmix.algorithms.kmeans import nearest_centre
from ppmix.components.family import DensityFamily
from ppmix.models._missing import log_prob_observed
from ppmix.models._starts import start_responsibilities
from ppmix.models.batch import Batch
from ppmix.ops.logspace import normalize_log_joint_

__all__ = ["Clamp", "KnownLabels", "KnownStates", "clamping", "known_latents", "seeded_kmeans"]

#: the engines that clamp known latents
CLAMPING_ENGINES = ("em", "svi", "mcmc")

#: Lloyd's iterations of the seeded k-means start at most (on separated clusters it settles in a few)
SEEDED_KMEANS_ITERATIONS = 100


@dataclass(frozen=True, eq=False)
class Clamp:
    """The known latents of one fit, as the engines use them.

    Attributes
    ----------
    argument : str
        The ``fit`` argument they came from (``"known_labels"``, ``"known_states"``), for messages.
    labels : LongTensor (N,) or (B, T)
        The known latent of every row (every step of every padded sequence), -1 where unknown (and at padding).
    log_mask : Tensor (N, K) or (B, T, K)
        0 where a state is allowed, ``-inf`` where it contradicts a known latent.

    Examples
    --------
    >>> clamp = Clamp.of("known_labels", torch.tensor([0, -1]), 2, torch.float64)
    >>> clamp.argument, clamp.labels.tolist(), clamp.log_mask.tolist()
    ('known_labels', [0, -1], [[0.0, -inf], [0.0, 0.0]])
    """

    argument: str
    labels: torch.Tensor
    log_mask: torch.Tensor

    @classmethod
    def of(cls, argument: str, labels: torch.Tensor, k: int, dtype: torch.dtype) -> "Clamp":
        """The clamp of ``labels`` (-1 unknown) over ``k`` states, its log-mask in ``dtype``.

        Examples
        --------
        >>> Clamp.of("known_labels", torch.tensor([1, -1]), 3, torch.float64).log_mask.tolist()
        [[-inf, 0.0, -inf], [0.0, 0.0, 0.0]]
        """
        known = labels >= 0
        one_hot = torch.nn.functional.one_hot(labels.clamp_min(0), k).bool()
        allowed = one_hot | ~known[..., None]
        log_mask = torch.zeros(allowed.shape, dtype=dtype, device=labels.device).masked_fill_(~allowed, -torch.inf)
        return cls(argument, labels, log_mask)

    def start(
        self,
        resp: torch.Tensor,
        points: torch.Tensor,
        valid: torch.Tensor | None = None,
        weight: torch.Tensor | None = None,
        family: DensityFamily | None = None,
    ) -> torch.Tensor:
        """The start's responsibilities ``(n, K)`` over the rows (over the valid steps ``labels[valid]``), given the
        default start's ``resp`` and the ``points`` ``(n, D)`` it clustered: where every state has a known row (of
        positive ``weight``, where the rows have weights ``(n,)``), the known rows one-hot and the others one-hot at
        their cluster of :func:`seeded_kmeans` (``resp`` unused), softened as the default start softens them for
        ``family`` (:func:`~ppmix.models._starts.start_responsibilities`; None: hard); otherwise ``resp`` with its
        clusters renumbered to agree best with the known latents and the known rows set to them (one-hot).

        Examples
        --------
        >>> resp = torch.tensor([[1.0, 0.0], [0.7, 0.3], [0.0, 1.0]], dtype=torch.float64)
        >>> points = torch.tensor([[0.0], [4.0], [5.0]], dtype=torch.float64)
        >>> Clamp.of("known_labels", torch.tensor([1, -1, 0]), 2, torch.float64).start(resp, points).tolist()
        [[0.0, 1.0], [1.0, 0.0], [1.0, 0.0]]
        >>> Clamp.of("known_labels", torch.tensor([1, -1, -1]), 2, torch.float64).start(resp, points).tolist()
        [[0.0, 1.0], [0.3, 0.7], [1.0, 0.0]]
        """
        labels = (self.labels if valid is None else self.labels[valid]).to(resp.device)
        known = labels >= 0
        k = resp.shape[1]
        one_hot = torch.nn.functional.one_hot(labels[known], k).to(resp)
        counted = one_hot if weight is None else one_hot * (weight[known] > 0).to(resp)[:, None]
        if bool((counted.sum(0) > 0).all()):  # every state labelled somewhere: k-means seeded by the labels
            clusters = torch.nn.functional.one_hot(seeded_kmeans(points, labels, k, weight), k).to(resp)
            start = clusters if family is None else start_responsibilities(family, clusters)
        else:  # the default start, its clusters renumbered to keep the most labelled rows
            agreement = (one_hot.T @ resp[known]).cpu().numpy()  # (label, cluster): the labelled rows' weight
            _, clusters = linear_sum_assignment(agreement, maximize=True)
            start = resp[:, torch.as_tensor(clusters, device=resp.device)]
        start[known] = one_hot
        return start

    def mixture_e_step(self, model: Any, data: Batch) -> tuple[Any, torch.Tensor]:
        """A mixture's clamped E-step on its EM :class:`~ppmix.models.batch.Batch` (rows the family prepared, or
        partly observed rows, maybe weighted): the M-step's statistics (``model._em_statistics``) under the
        responsibilities ``softmax_k(log w_k + log p_k(x_n) + mask[n, k])`` and the log-likelihood
        ``log p(X, z_known)`` (every row counted as often as its sample weight)."""
        components = model.components_
        if data.observed is not None:
            log_joint = log_prob_observed(components, data.observed)
        else:
            log_joint = components.log_prob(data.rows)
        resp, log_norm = normalize_log_joint_(log_joint + model.weights_.log() + self.log_mask)
        log_norm = log_norm.reshape(-1)
        objective = log_norm.sum() if data.weight is None else log_norm @ data.weight.to(log_norm)
        return model._em_statistics(data, resp), objective

    def emissions(self, log_emit: torch.Tensor) -> torch.Tensor:
        """An HMM's emission log-densities ``(B, T, K)`` with the states that contradict a known state excluded."""
        return log_emit + self.log_mask.to(log_emit)

    def factor(self, name: str, z: torch.Tensor, *index: Any) -> None:
        """In a Pyro program, beside the (enumerated) latent ``z`` of the rows ``log_mask[index]`` ``(n, K)``:
        ``pyro.factor(name + "_known", mask[n, z_n])``, zero where ``z`` is allowed, ``-inf`` where it contradicts a
        known latent."""
        pyro.factor(f"{name}_known", Vindex(self.log_mask[index])[..., z])


def seeded_kmeans(
    points: torch.Tensor, labels: torch.Tensor, k: int, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """The cluster of every row ``(n,)``: k-means (Lloyd's iterations, Euclidean) whose centres start at the labelled
    classes' (``weight``-ed) means of ``points`` ``(n, D)``, every labelled row kept in its class (``labels`` ``(n,)``,
    -1 where unknown) and the others moved to their nearest centre, until no row moves (at most
    :data:`SEEDED_KMEANS_ITERATIONS` times). Every class must hold a labelled row of positive weight.

    Examples
    --------
    >>> points = torch.tensor([[0.0], [1.0], [2.5], [5.0], [6.0]], dtype=torch.float64)
    >>> seeded_kmeans(points, torch.tensor([0, -1, -1, -1, 1]), 2).tolist()
    [0, 0, 0, 1, 1]
    """
    row_weight = torch.ones_like(points[:, 0]) if weight is None else weight.to(points)
    free = labels < 0
    clusters = labels.clone()
    for _ in range(SEEDED_KMEANS_ITERATIONS):
        members = (
            torch.nn.functional.one_hot(clusters.clamp_min(0), k).to(points) * (row_weight * (clusters >= 0))[:, None]
        )
        centres = (members.T @ points) / members.sum(0)[:, None]
        nearest = nearest_centre(points[free], centres)
        if torch.equal(nearest, clusters[free]):
            break
        clusters[free] = nearest
    return clusters


def _integer_labels(values: Any, argument: str) -> np.ndarray:
    """``values`` as a 1-D int64 array (integers, or floats holding integers); else a ``ValueError``."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.dtype == bool or array.dtype.kind not in "iuf":
        raise ValueError(f"{argument} must hold integer labels (-1 where unknown); got dtype {array.dtype}")
    if array.ndim != 1:
        raise ValueError(f"{argument} must be 1-D (one label per row or step); got shape {array.shape}")
    if array.dtype.kind == "f":
        if not np.isfinite(array).all():
            raise ValueError(f"{argument} holds NaN or inf: mark an unknown label with -1")
        if (array != np.round(array)).any():
            raise ValueError(
                f"{argument} must hold integer labels (-1 where unknown); got {array[array != np.round(array)][0]!r}"
            )
    return array.astype(np.int64)


def _check_range(labels: np.ndarray, k: int, argument: str) -> None:
    """Every label in ``0..k-1`` or -1."""
    outside = (labels < -1) | (labels >= k)
    if outside.any():
        first = int(np.argmax(outside))
        raise ValueError(
            f"{argument} must hold labels in 0..{k - 1} (n_components={k}) or -1 where unknown; got {labels[first]} "
            f"at position {first}"
        )


@dataclass(frozen=True)
class KnownLabels:
    """``known_labels`` of ``Mixture.fit``: one component per row, -1 where unknown.

    Examples
    --------
    >>> from ppmix import GMM
    >>> KnownLabels([1, -1, 0]).resolve(GMM(2), torch.zeros(3, 1)).log_mask.tolist()
    [[-inf, 0.0], [0.0, 0.0], [0.0, -inf]]
    >>> KnownLabels([-1, -1, -1]).resolve(GMM(2), torch.zeros(3, 1)) is None  # nothing known: the unsupervised fit
    True
    """

    values: Any
    argument: str = "known_labels"

    def resolve(self, model: Any, rows: torch.Tensor) -> Clamp | None:
        """The clamp of the prepared rows ``rows`` ``(N, D)``; None where no label is known.

        Raises
        ------
        ValueError
            Not one integer per row, or a label outside ``0..K-1`` other than -1.
        """
        if self.values is None:
            return None
        labels = _integer_labels(self.values, self.argument)
        if labels.shape[0] != rows.shape[0]:
            raise ValueError(f"{self.argument} has {labels.shape[0]} labels but X has {rows.shape[0]} rows")
        _check_range(labels, int(model.n_components), self.argument)
        if (labels < 0).all():
            return None
        return Clamp.of(
            self.argument, torch.as_tensor(labels, device=rows.device), int(model.n_components), model.dtype
        )


@dataclass(frozen=True)
class KnownStates:
    """``known_states`` of ``HMM.fit``: one integer array per sequence, a state per step, -1 where unknown.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import HMM
    >>> hmm = HMM(2, transition_pattern="left-right")
    >>> batch = hmm.prepare_data([np.zeros((3, 1)), np.zeros((2, 1))], fitting=True)
    >>> KnownStates([[0, -1, 1], [-1, 1]]).resolve(hmm, batch).labels.tolist()  # padded with -1
    [[0, -1, 1], [-1, 1, -1]]
    >>> KnownStates([[1, -1, 0], [-1, -1]]).resolve(hmm, batch)
    Traceback (most recent call last):
    ...
    ValueError: known_states[0] has state 1 at step 0 and state 0 at step 2, but transition_pattern allows no path ...
    """

    values: Any
    argument: str = "known_states"

    def resolve(self, model: Any, batch: Any) -> Clamp | None:
        """The clamp of the prepared :class:`~ppmix.models._sequences.SequenceBatch` ``batch`` (padded with -1);
        None where no state is known.

        Raises
        ------
        ValueError
            Not one integer array per sequence of its length, a state outside ``0..K-1`` other than -1, or two
            consecutive known states whose transition ``transition_pattern`` forbids.
        """
        if self.values is None:
            return None
        if isinstance(self.values, (str, bytes)) or not hasattr(self.values, "__len__"):
            raise ValueError(f"{self.argument} must be a list of integer arrays, one per sequence")
        lengths = batch.lengths.tolist()
        if len(self.values) != len(lengths):
            raise ValueError(f"{self.argument} has {len(self.values)} sequences but X has {len(lengths)}")
        padded = np.full((len(lengths), batch.max_length), -1, dtype=np.int64)
        k = int(model.n_components)
        for b, (states, length) in enumerate(zip(self.values, lengths)):
            labels = _integer_labels(states, f"{self.argument}[{b}]")
            if labels.shape[0] != length:
                raise ValueError(
                    f"{self.argument}[{b}] has {labels.shape[0]} states but sequence {b} has {length} steps"
                )
            _check_range(labels, k, f"{self.argument}[{b}]")
            padded[b, :length] = labels
        if (padded < 0).all():
            return None
        _check_allowed_moves(padded, model._transition_mask.cpu().numpy(), self.argument)
        labels = torch.as_tensor(padded, device=batch.lengths.device)
        return Clamp.of(self.argument, labels, k, model.dtype)


def _check_allowed_moves(states: np.ndarray, allowed: np.ndarray, argument: str) -> None:
    """Every known state ``j`` at step ``t + g`` must be reachable from the sequence's previous known state ``i`` at
    step ``t`` in ``g`` moves the chain allows: ``(allowed^g)[i, j]``, the boolean matrix power."""
    sequence, step = np.nonzero(states >= 0)  # row-major: by sequence, then by step
    same = sequence[1:] == sequence[:-1]
    b, t, gaps = sequence[1:][same], step[:-1][same], np.diff(step)[same]
    i, j = states[b, t], states[b, t + gaps]
    distinct, which = np.unique(gaps, return_inverse=True)
    reachable = _boolean_powers(allowed, distinct)[which.reshape(-1), i, j]
    if reachable.all():
        return
    first = int(np.argmin(reachable))
    b, t, g, i, j = (int(v[first]) for v in (b, t, gaps, i, j))
    if g == 1:
        raise ValueError(
            f"{argument}[{b}] moves from state {i} to {j} at step {t + 1}, which transition_pattern forbids"
        )
    raise ValueError(
        f"{argument}[{b}] has state {i} at step {t} and state {j} at step {t + g}, but transition_pattern allows no "
        f"path of {g} moves from {i} to {j}: change a known state or mark it unknown (-1)"
    )


def _boolean_powers(allowed: np.ndarray, exponents: np.ndarray) -> np.ndarray:
    """``allowed^e`` ``(E, K, K)`` for the increasing ``exponents``, in boolean arithmetic (is there a path of ``e``
    moves): each from the previous times ``allowed`` to the difference, by repeated squaring."""
    powers = np.empty((len(exponents), *allowed.shape), dtype=bool)
    power, previous = np.eye(len(allowed), dtype=bool), 0
    for n, exponent in enumerate(exponents):
        power = _boolean_product(power, _boolean_power(allowed, int(exponent) - previous))
        powers[n], previous = power, int(exponent)
    return powers


def _boolean_power(allowed: np.ndarray, exponent: int) -> np.ndarray:
    """``allowed^exponent`` in boolean arithmetic, by repeated squaring."""
    power, base = np.eye(len(allowed), dtype=bool), allowed
    while exponent:
        if exponent & 1:
            power = _boolean_product(power, base)
        base, exponent = _boolean_product(base, base), exponent >> 1
    return power


def _boolean_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The boolean matrix product: ``[i, j]`` is whether some ``a[i, m]`` and ``b[m, j]`` are both true."""
    return (a.astype(np.int64) @ b.astype(np.int64)) > 0


def known_latents(model: Any, options: dict[str, Any]) -> KnownLabels | KnownStates | None:
    """The known latents among ``fit``'s ``options`` (taken out of them), under the model's
    ``known_latents_argument``; None where the model takes none or none is given.

    Raises
    ------
    TypeError
        Known latents under the name another structure takes (``known_labels`` for an HMM, ``known_states`` for
        a mixture), or under any name for a model that takes none.

    Examples
    --------
    >>> from ppmix import GMM, HMM
    >>> options = {"known_labels": [0, -1], "max_iter": 5}
    >>> known_latents(GMM(2), options), options
    (KnownLabels(values=[0, -1], argument='known_labels'), {'max_iter': 5})
    >>> known_latents(HMM(2), {"known_labels": [0, -1]})
    Traceback (most recent call last):
    ...
    TypeError: HMM takes known_states, not known_labels: pass fit(..., known_states=...)
    """
    argument = type(model).known_latents_argument
    _refuse_the_other_argument(type(model).__name__, argument, options)
    if argument is None or argument not in options:
        return None
    kind = {KnownLabels.argument: KnownLabels, KnownStates.argument: KnownStates}[argument]
    return kind(options.pop(argument))


def _refuse_the_other_argument(name: str, argument: str | None, options: dict[str, Any]) -> None:
    """A ``TypeError`` where ``options`` give known latents under the name another structure takes."""
    for other in (KnownLabels.argument, KnownStates.argument):
        if other != argument and other in options:
            if argument is None:
                raise TypeError(f"{name} takes no {other}: its fit clamps no latent")
            raise TypeError(f"{name} takes {argument}, not {other}: pass fit(..., {argument}=...)")


@contextlib.contextmanager
def clamping(
    model: Any, known: KnownLabels | KnownStates | None, data: Any, engine: str, options: dict[str, Any]
) -> Iterator[None]:
    """Inside the context ``model._known_latents`` is the :class:`Clamp` of ``known`` on the prepared ``data`` (None
    without known latents), which the EM hooks and the Pyro program read; MCMC's draws are not relabelled unless
    ``options`` ask for it.

    Raises
    ------
    ValueError
        Known latents with an engine that does not clamp them (``"gibbs"``), or invalid known latents.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import GMM
    >>> gmm = GMM(2)
    >>> data = gmm.prepare_data(np.array([[0.0], [1.0], [5.0]]), fitting=True)
    >>> with clamping(gmm, KnownLabels([0, -1, 1]), data, "em", {}):
    ...     gmm._known_latents.labels.tolist()
    [0, -1, 1]
    >>> gmm._known_latents is None
    True
    """
    clamp = None if known is None else known.resolve(model, data)
    if clamp is None:
        yield
        return
    if engine not in CLAMPING_ENGINES:
        raise ValueError(f"{clamp.argument} is taken by engine in {CLAMPING_ENGINES}; got engine={engine!r}")
    if engine == "mcmc":
        options.setdefault("relabel", False)  # the known latents name the components
    with model._overriding("_known_latents", clamp):
        yield
