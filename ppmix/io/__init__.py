"""Saving and loading fitted models: tensors plus a JSON config, written atomically and verified on load.

A saved model is a directory holding two files:

``config.json``
    format name and version, ppmix version, class, constructor arguments (``params``),
    fitted attributes (``fitted``), extra JSON state (``extra``), the SHA-256 of the tensor
    file (``tensors_sha256``) and ``config_sha256``: the SHA-256 of the canonical JSON of
    every other field. Because the tensor checksum is one of those fields, ``config_sha256``
    is one checksum over both files: any edit of either file is refused at load.
``tensors.pt``
    read with ``torch.load(weights_only=True)``, which never unpickles arbitrary objects.

**Saving is atomic.** Both files are written (and fsynced) into a temporary sibling
directory ``.{name}.tmp-XXXX``, which then takes the place of ``path``: on Linux by one
``renameat2(RENAME_EXCHANGE)`` swap, so that at every instant either the previous or the
new complete model is at ``path``; elsewhere (or on file systems without the swap) by two
renames, the previous model being put back if the second fails. A save that fails at any
step (a value JSON cannot hold, a full disk) leaves the previous model loadable and no
temporary directory behind. ``save`` replaces only an empty directory or a previous ppmix
save: a directory holding other files, or a file, is refused (:func:`check_save_target`).

A save interrupted at any step (an error, a full disk, ``KeyboardInterrupt``) leaves no
temporary directory either: its name is known before it is created, and the clean-up runs to
its end even if interrupted again. The temporary name keeps only a few characters of
``name``, so that targets of any legal name length save.

**Loading reads one version.** Both files are opened through one handle of the directory
(``openat``, :mod:`ppmix.io.snapshot`), so a load while another process saves over ``path``
reads the previous or the new model, never one file of each.

**Loading is verified.** The format version is checked first, then the checksum, then a
schema: ``params`` must be constructor arguments of the saved class with values of their
annotated types, ``fitted`` only the attributes in ``_FITTED`` (never arbitrary names), the
tensor file a flat ``{name: tensor}``. Then the state is checked against the config
(:mod:`ppmix.io.state_check`): every entry the settings imply (``Savable._state_shapes``), no
other, each of the shape they imply, every value finite; so a file whose checksums were forged
still cannot contradict its config. Every refusal is a ``ValueError`` (a missing file a
``FileNotFoundError``) naming the file and field or entry. ``map_location`` (or the saved
device) that cannot hold tensors here is refused naming it.

Format version 1 (ppmix before the config checksum) is still read: its tensors are checked
against their checksum and its config against the schema, but edits of a version-1
``config.json`` that keep the schema cannot be detected (a warning is logged); save it
again to write version 2. Saves whose layout an older ppmix wrote are brought to the current one
by their class (``Savable._upgrade_saved``), or refused saying which ppmix and format version
wrote them and what to do.
"""

from ppmix.io.atomic import check_save_target
from ppmix.io.model_files import Savable, load_model, save_model
from ppmix.io.registry import lookup_class, qualified_name, register_savable
from ppmix.io.reports import strict_json, write_json
from ppmix.io.schema import CONFIG_FILE, FORMAT_VERSION, TENSOR_FILE, config_checksum

__all__ = [
    "strict_json",
    "write_json",
    "CONFIG_FILE",
    "FORMAT_VERSION",
    "TENSOR_FILE",
    "Savable",
    "check_save_target",
    "config_checksum",
    "load_model",
    "lookup_class",
    "qualified_name",
    "register_savable",
    "save_model",
]
