"""What a subclass of a built-in structure must rewrite when it replaces the structure's program."""

from __future__ import annotations

__all__ = ["PROGRAM_HOOKS", "refuse_stale_hooks"]

#: methods a model writes for its own program: a subclass that replaces ``model`` must rewrite those it inherits
PROGRAM_HOOKS = ("_e_step", "_get_globals", "_set_globals", "_pointwise_log_likelihood")


def refuse_stale_hooks(cls: type, base: type) -> None:
    """Refuse a subclass that replaced ``model`` but inherits hooks written for an ancestor's other program
    (e.g. ``class PoissonHMM(HMM)`` with a new ``model``: HMM's EM would fit the Gaussian HMM). ``base`` is
    :class:`~ppmix.models.base.MixtureModel`, whose generic hooks serve every program.

    Examples
    --------
    >>> class Base:
    ...     def model(self): ...
    ...     def _get_globals(self): ...
    >>> class Structure(Base):
    ...     def model(self): ...
    ...     def _e_step(self): ...
    >>> class Replaced(Structure):
    ...     def model(self): ...
    >>> refuse_stale_hooks(Structure, Base)
    >>> refuse_stale_hooks(Replaced, Base)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: Replaced replaces model() but inherits ['_e_step'] from Structure, ...
    """
    program = cls.model
    stale: dict[str, str] = {}
    for hook in PROGRAM_HOOKS:
        owner = next((c for c in cls.__mro__ if hook in vars(c)), None)
        if owner is None or owner is base or getattr(owner, "model", None) in (None, program):
            continue
        stale[hook] = owner.__name__
    if stale:
        owners = sorted(set(stale.values()))
        raise TypeError(
            f"{cls.__name__} replaces model() but inherits {sorted(stale)} from {', '.join(owners)}, written for "
            f"{owners[0]}'s own program: fitting would silently fit that program instead of yours. For a new "
            "component or emission family use Mixture(family=...) or HMM(emission=...) (see "
            "docs/guide/writing-a-family.md); otherwise subclass MixtureModel, or write these methods for your program"
        )
