"""Data prepared once per fit for the Gaussian families.

Centring by a point near the data before forming second moments keeps the
``E[x^2] - E[x]^2`` algebra accurate (also in float32); the prepared object is
reused by every E- and M-step of a fit, so derived arrays are built only once.

The algebra is exact for any centre, so the centre only sets the rounding. A fit centres
its training data at their column mean; predictions centre at a point the fitted model
fixes (the families' ``reference``, the mean of the component means), never at the mean
of the batch, so that a row's prediction depends on that row and the model only.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch

from ppmix.components.family import PreparedRows

#: bytes of one block of rows of ``[x, x^2]`` or ``[x, x x^T]`` that the row-blocked passes build and reuse,
#: for one or two CPU threads (half as much per thread beyond): small enough to stay in cache while the
#: block's products run (on a 2-core EPYC 2 and 4 MiB run alike, 8 MiB and more 1.5-3x slower)
BLOCK_BYTES = 2**22
#: bytes of one block on a GPU, where fewer, larger kernels are what counts
GPU_BLOCK_BYTES = 2**28


@dataclass
class CentredData(PreparedRows):
    """Feature matrix ``x`` with its column mean ``shift`` and ``x - shift`` cached (the Gaussian family's prepared
    data: k-means starts on the centred rows)."""

    x: torch.Tensor
    shift: torch.Tensor
    centred: torch.Tensor
    #: the one-block designs of :meth:`moment_blocks`, by ``outer``, once built
    _designs: dict[bool, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_tensor(cls, x: torch.Tensor, shift: torch.Tensor | None = None) -> "CentredData":
        """Centre ``x`` at ``shift`` (default: its column mean, for training data).

        Examples
        --------
        >>> data = CentredData.from_tensor(torch.tensor([[1.0], [3.0]]))
        >>> data.shift.tolist(), data.centred.ravel().tolist()
        ([2.0], [-1.0, 1.0])
        >>> CentredData.from_tensor(torch.tensor([[1.0]]), shift=torch.tensor([0.5])).centred.item()
        0.5
        """
        shift = x.mean(dim=0) if shift is None else shift.to(dtype=x.dtype, device=x.device)
        return cls(x=x, shift=shift, centred=x - shift)

    @property
    def n_samples(self) -> int:
        return int(self.x.shape[0])

    @property
    def rows(self) -> torch.Tensor:
        return self.x

    @property
    def start_points(self) -> torch.Tensor:
        return self.centred

    def block_rows(self, width: int) -> int:
        """Rows per block of a ``width``-column design built from these data (:meth:`moment_blocks`).

        On the CPU :data:`BLOCK_BYTES` (at most 32k rows) for one or two threads of torch's pool, and half
        of it per thread for ``T > 2``: every operation on a block is split between the threads, so each
        thread's share stays in its cache while ``T`` threads fork and join their pool ``T / 2`` times less
        often than with blocks sized for one thread (with those, the full-covariance E-step took longer at 16
        threads of an H100 host than at one thread of a 2-core EPYC: the pool's overhead, not the work).

        Examples
        --------
        >>> data = CentredData.from_tensor(torch.zeros(10, 2, dtype=torch.float64))
        >>> data.block_rows(4) == 32_768 * max(2, torch.get_num_threads()) // 2
        True
        """
        row_bytes = max(1, width * self.centred.element_size())
        if self.centred.device.type == "cuda":
            return max(64, GPU_BLOCK_BYTES // row_bytes)
        return max(64, min(32_768, BLOCK_BYTES // row_bytes) * max(2, torch.get_num_threads()) // 2)

    def row_blocks(self) -> Iterator[tuple[slice, torch.Tensor]]:
        """The centred rows in consecutive blocks of :meth:`block_rows` rows (views, no copy), each with its slice.

        Examples
        --------
        >>> data = CentredData.from_tensor(torch.tensor([[1.0], [3.0]]))
        >>> [(rows.stop, block.ravel().tolist()) for rows, block in data.row_blocks()]
        [(2, [-1.0, 1.0])]
        """
        n, d = self.centred.shape
        rows = self.block_rows(d)
        for start in range(0, n, rows) if n else ():
            yield slice(start, min(start + rows, n)), self.centred[start : start + rows]

    def moment_blocks(self, outer: bool = False) -> Iterator[tuple[slice, torch.Tensor]]:
        """``[x - s, (x - s)^2]`` (``(rows, 2D)``), or with ``outer`` ``[x - s, (x_i - s_i)(x_j - s_j) for
        i <= j]`` (``(rows, D + D(D+1)/2)``, the pairs in :func:`upper_triangle`'s order), for consecutive
        blocks of rows.

        Built in one reused buffer: a pass over the data reads ``x`` once, forms the products in
        cache and never holds an ``N``-row design. A block is valid until the next one is yielded. Data whose
        whole design takes at most :data:`BLOCK_BYTES` are one block, built on the first pass and kept for every
        later one (every E-step of a fit on small data reuses it).

        Examples
        --------
        >>> data = CentredData.from_tensor(torch.tensor([[1.0, 2.0], [3.0, 6.0]]))
        >>> [block.tolist() for _, block in data.moment_blocks(outer=True)]
        [[[-1.0, -2.0, 1.0, 2.0, 4.0], [1.0, 2.0, 1.0, 2.0, 4.0]]]
        """
        n, d = self.centred.shape
        if self.centred.requires_grad:  # under autograd (e.g. SVI): one block, built without in-place writes
            rows, cols = upper_triangle(d, self.centred.device)
            products = self.centred[:, rows] * self.centred[:, cols] if outer else self.centred.square()
            yield slice(0, n), torch.cat([self.centred, products], dim=1)
            return
        width = d + (d * (d + 1) // 2 if outer else d)
        rows = self.block_rows(width)
        if n <= rows and n * width * self.centred.element_size() <= BLOCK_BYTES:  # one block, kept
            if outer not in self._designs:
                self._designs[outer] = _fill_design(self.centred, self.centred.new_empty(n, width), outer)
            yield slice(0, n), self._designs[outer]
            return
        buffer = self.centred.new_empty(min(rows, n), width)
        for start in range(0, n, rows):
            block = self.centred[start : start + rows]
            yield slice(start, start + block.shape[0]), _fill_design(block, buffer[: block.shape[0]], outer)


def _fill_design(block: torch.Tensor, design: torch.Tensor, outer: bool) -> torch.Tensor:
    """``design`` (``(rows, width)``) filled with :meth:`CentredData.moment_blocks`'s design of the centred rows
    ``block``."""
    d = block.shape[1]
    design[:, :d] = block
    if not outer:
        torch.square(block, out=design[:, d:])
        return design
    column = d
    for i in range(d):
        torch.mul(block[:, i : i + 1], block[:, i:], out=design[:, column : column + d - i])
        column += d - i
    return design


def blocked_log_density(
    data: CentredData, natural: torch.Tensor, const: torch.Tensor, outer: bool = False
) -> torch.Tensor:
    """``const_k + natural_k . t(x_n)`` for every row and component, ``(N, K)``, with ``t(x)`` the design
    row of :meth:`CentredData.moment_blocks`: one product per block of rows, in the ``(K, rows)``
    orientation (2-2.5x faster in MKL than ``(rows, K)`` for a few components).

    Examples
    --------
    >>> data = CentredData.from_tensor(torch.tensor([[-1.0], [1.0]], dtype=torch.float64))
    >>> natural = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    >>> blocked_log_density(data, natural, torch.zeros(2, 1, dtype=torch.float64)).tolist()
    [[-1.0, 1.0], [1.0, 1.0]]
    """
    log_density = natural.new_empty(data.n_samples, natural.shape[0])
    for rows, design in data.moment_blocks(outer=outer):
        log_density[rows] = torch.addmm(const, natural, design.T).T
    return log_density


def fused_expected_sums(
    data: CentredData,
    natural: torch.Tensor,
    const: torch.Tensor,
    outer: bool = False,
    row_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One pass of the fused E-step of an exponential family over the design blocks of ``data``.

    The log-joint of every row and component is ``const_k + natural_k . t(x_n)`` with ``t(x)`` the
    design row of :meth:`CentredData.moment_blocks` (``[x, x^2]``, or ``[x, x x^T]`` with ``outer``);
    per block, while it is in cache: that product ``(K, rows)``, its normalisation over ``K``
    (the responsibilities ``r_nk``) and the block's contribution to the sums. Returns the total
    responsibilities ``(K,)``, the weighted design sums ``sum_n r_nk t(x_n)`` ``(K, width)`` and the
    log-likelihood ``sum_n log sum_k exp(const_k + natural_k . t(x_n))``. With ``row_weights`` ``(N,)`` every
    row's responsibilities and log-likelihood count that many times (``sample_weight``).

    Examples
    --------
    >>> data = CentredData.from_tensor(torch.tensor([[-1.0], [1.0]], dtype=torch.float64))
    >>> natural = torch.tensor([[-1.0, -0.5], [1.0, -0.5]], dtype=torch.float64)  # N(-1, 1) and N(1, 1)
    >>> totals, sums, log_lik = fused_expected_sums(data, natural, torch.zeros(2, 1, dtype=torch.float64))
    >>> [round(v, 4) for v in totals.tolist()], round(float(sums[0, 0]), 4)
    ([1.0, 1.0], -0.7616)
    """
    return fused_block_sums(data.moment_blocks(outer=outer), natural, const, row_weights)


def fused_block_sums(
    blocks: Iterable[tuple[slice, torch.Tensor]],
    natural: torch.Tensor,
    const: torch.Tensor,
    row_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`fused_expected_sums` over any blocks of design rows ``(rows, width)`` (with the slice of the rows
    each block holds): the log-joint ``const_k + natural_k . t_n``, its normalisation over ``K``, the total
    responsibilities ``(K,)``, the weighted sums ``(K, width)`` and the log-likelihood.

    Examples
    --------
    >>> t = torch.tensor([[-1.0], [1.0]], dtype=torch.float64)
    >>> natural, const = torch.tensor([[-1.0], [1.0]], dtype=torch.float64), torch.zeros(2, 1, dtype=torch.float64)
    >>> totals, sums, _ = fused_block_sums([(slice(0, 2), t)], natural, const)
    >>> [round(v, 4) for v in totals.tolist()], round(float(sums[0, 0]), 4)
    ([1.0, 1.0], -0.7616)
    """
    totals = sums = log_likelihood = None
    for rows, design in blocks:
        resp = torch.addmm(const, natural, design.T)  # (K, rows): the fast orientation of the product
        largest = resp.amax(dim=0)
        resp.sub_(largest).exp_()
        norm = resp.sum(dim=0)
        if row_weights is None:
            resp.div_(norm)
            block_log_likelihood = norm.log_().add_(largest).sum()
        else:
            weight = row_weights[rows]
            resp.mul_(weight / norm)
            block_log_likelihood = norm.log_().add_(largest) @ weight
        if totals is None:  # the first block's sums are the totals' start (one block: no accumulation at all)
            totals, sums, log_likelihood = resp.sum(dim=1), resp @ design, block_log_likelihood
        else:
            totals += resp.sum(dim=1)
            sums.addmm_(resp, design)
            log_likelihood += block_log_likelihood
    if totals is None:  # no rows
        return natural.new_zeros(natural.shape[0]), natural.new_zeros(natural.shape), natural.new_zeros(())
    return totals, sums, log_likelihood


@functools.lru_cache(maxsize=64)
def upper_triangle(d: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column indices of the upper triangle (diagonal included) of a ``d x d`` matrix (made once per size
    and device: every E- and M-step of a full-covariance fit indexes with them; not to be written to). Made as
    ordinary tensors even under ``torch.inference_mode`` (a fit's EM), so that autograd may use them later."""
    with torch.inference_mode(False):
        rows, cols = torch.triu_indices(d, d, device=device)
    return rows, cols


def as_centred(
    data: torch.Tensor | CentredData,
    dtype: torch.dtype | None = None,
    device: torch.device | None = None,
    shift: torch.Tensor | None = None,
) -> CentredData:
    """Return ``data`` prepared in ``dtype`` on ``device`` (no copy when it already is).

    Prepared data keep their centre; a plain tensor is centred at ``shift`` (default: its
    column mean).
    """
    if isinstance(data, CentredData):
        if (dtype is None or data.x.dtype == dtype) and (device is None or data.x.device == device):
            return data
        data, shift = data.x, data.shift
    data = torch.as_tensor(data)
    if data.dim() != 2:
        raise ValueError("data must be a 2-D tensor (n_samples, n_features)")
    return CentredData.from_tensor(data.to(dtype=dtype, device=device), shift)


def cancellation_tol(dtype: torch.dtype) -> float:
    """The largest relative rounding error tolerated where the moment algebra cancels, in ``dtype``.

    Half the significant digits (``sqrt(eps)``: 1.5e-8 in float64, 3.5e-4 in float32):
    log-densities (in nats) and variances whose moment products would cancel more are
    computed directly instead. This happens only for components far from the centre or
    collapsed at the floor, so the fast path stays the rule, in float32 too.

    Examples
    --------
    >>> cancellation_tol(torch.float64) < 2e-8 < cancellation_tol(torch.float32)
    True
    """
    return math.sqrt(torch.finfo(dtype).eps)


def expansion_rounding(
    loc_c: torch.Tensor, precision: torch.Tensor, sd: torch.Tensor, linear: torch.Tensor | None = None
) -> torch.Tensor:
    """Nats per component ``(K,)`` that the moment product ``const_k + natural_k . t(x)`` may lose to rounding
    beyond what the direct formula ``-(x - mu)^T P (x - mu) / 2`` loses, on the rows the component explains.

    The product adds terms of size ``|x|^T |P| |x| / 2 + |x|^T |P mu| + mu^T P mu / 2`` (``x`` and ``mu =
    loc_c`` about the centre) to reach a log-density of size ``(x - mu)^T P (x - mu) / 2``: the excess is
    large for a component far from the centre in its own standard deviations ``sd`` (or collapsed at the
    floor away from it), not for rows far from every component, whose log-densities are as large as the
    terms that make them. Bounded over the rows within three standard deviations of the component
    (``|x| <= |mu| + 3 sd`` per feature), less the log-density of a row at three standard deviations, which
    the direct formula rounds alike. ``precision`` is ``(K, D)`` for diagonal covariances (where this is
    ``2 sum_d P_d |mu_d| (|mu_d| + 3 sd_d)``) or ``(K, D, D)``; times the dtype's epsilon. ``linear``: ``P mu``
    ``(K, D)`` where the caller has it (full covariances).

    Examples
    --------
    >>> f64 = torch.float64
    >>> loc_c, sd = torch.tensor([[0.0], [1e6]], dtype=f64), torch.ones(2, 1, dtype=f64)
    >>> nats = expansion_rounding(loc_c, 1 / sd.square(), sd)
    >>> nats.tolist()[0], bool(nats[1] > cancellation_tol(f64))
    (0.0, True)
    >>> bool(torch.allclose(nats, expansion_rounding(loc_c, torch.diag_embed(1 / sd.square()), sd)))
    True
    """
    size = loc_c.abs()
    if precision.dim() == 2:  # diagonal: the bound in closed form, no (K, D, D) array
        excess = 2 * (precision * size * (size + 3 * sd)).sum(dim=-1)
    else:
        bound = size + 3 * sd

        def quadratic(a: torch.Tensor, matrix: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            """``a_k^T M_k b_k`` per component (batched products: no einsum path search per call)."""
            return ((a.unsqueeze(1) @ matrix).squeeze(1) * b).sum(dim=-1)

        linear = (precision @ loc_c.unsqueeze(-1)).squeeze(-1) if linear is None else linear
        excess = (
            0.5 * quadratic(bound, precision.abs(), bound)
            + (bound * linear.abs()).sum(dim=-1)
            + 0.5 * (loc_c * linear).sum(dim=-1)
            - 4.5 * quadratic(sd, precision, sd)
        )
    return torch.finfo(precision.dtype).eps * excess


def inexact_spreads(second: torch.Tensor, spread: torch.Tensor) -> list[int]:
    """Components whose spread ``second - mean^2`` (per component, ``(K,)``: a variance or a trace of
    covariances about the centre) lost more than :func:`cancellation_tol` of its digits to rounding.

    ``second`` is the weighted mean square about the centre, whose rounding the difference inherits.

    Examples
    --------
    >>> inexact_spreads(torch.tensor([2.0, 1e20], dtype=torch.float64), torch.tensor([1.0, 1e-5], dtype=torch.float64))
    [1]
    """
    eps = torch.finfo(second.dtype).eps
    return torch.nonzero(eps * second > cancellation_tol(second.dtype) * spread).flatten().tolist()


def component_counts(weights: torch.Tensor) -> torch.Tensor:
    """Effective number of points per component, kept away from zero."""
    return padded_counts(weights.sum(dim=0))


def padded_counts(counts: torch.Tensor) -> torch.Tensor:
    """Total weights ``(K,)`` kept away from zero, so that an empty component divides safely."""
    return counts + 10 * torch.finfo(counts.dtype).eps


def as_floor(reg_covar: float | torch.Tensor) -> float | torch.Tensor:
    """The variance floor of a Gaussian family: a scalar as ``float``, a per-feature floor ``(D,)`` as a tensor."""
    if isinstance(reg_covar, torch.Tensor) and reg_covar.numel() > 1:
        return reg_covar.detach()
    return float(reg_covar)
